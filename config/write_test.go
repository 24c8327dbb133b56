package config

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// builtConfig is a configuration built in code with every section: NATS, gateway,
// health, security, devices, classes (standard ones with their priority left zero, and
// one of its own), a local and a remote pool (written out of name order), and models of
// three kinds.
func builtConfig(dir string) *Config {
	no := false
	c := &Config{
		NATS: NATS{Embedded: true, Listen: "127.0.0.1:0", Name: "rt", User: "gateway",
			PasswordFile: filepath.Join(dir, "gw.pass"), TLSCA: filepath.Join(dir, "ca.pem"), InboxPrefix: "_INBOX_gateway"},
		Gateway: Gateway{ID: "gw1", HTTPListen: "127.0.0.1:0", ShutdownGrace: Duration(3 * time.Second),
			RestartBackoffMin: Duration(250 * time.Millisecond), CrashLoopCount: 100, Policy: PolicyFIFO, Failover: true,
			HTTPHosts: []string{"ortbus.test"}, HTTPMaxBody: 1 << 20, HTTPMaxConcurrent: 4},
		Health: Health{HeartbeatInterval: Duration(100 * time.Millisecond), MissCount: 5},
		Security: Security{AllowedRoots: []string{filepath.Join(dir, "images")}, SpoolDir: filepath.Join(dir, "images", "spool"),
			MaxImagePixels: 1 << 20, MaxImageBytes: 8 << 20, OutputRoots: []string{filepath.Join(dir, "out")}},
		Devices: map[string]Device{"cpu": {Capacity: 300 << 20, SafeFraction: 0.5}, "cuda:0": {}},
		Classes: map[string]*Class{
			"batch": {Chain: []string{"zeta"}, QueueBound: 10, Timeout: Duration(30 * time.Second), Degrade: true,
				Models: map[string]string{"tag": "tagger"}},
			"bulk": {Priority: 3, Timeout: Duration(time.Minute), Shed: ShedDropOldest, MinShare: 0.2, QueueBytes: 1 << 20},
		},
		Pools: map[string]*Pool{
			"zeta": {Runtime: filepath.Join(dir, "ort", "libonnxruntime.so.1"), RuntimeDirs: []string{filepath.Join(dir, "ort2")},
				Env: map[string]string{"OMP_NUM_THREADS": "1"}, Workers: 2, Slots: 2, Threads: 1, MaxBatch: 8,
				MaxDelay: Duration(20 * time.Millisecond), Nice: 10, Classes: []string{"interactive", "batch", "bulk"},
				Models: []string{"tagger", "detector"}, PathMap: map[string]string{"/client": "/srv/images"}},
			"alpha": {Local: &no, EP: "cuda", EPOptions: map[string]string{"device_id": "0"}, Fallback: []string{"cpu"},
				Classes: []string{"interactive"}, Models: []string{"tagger", "ccip"},
				NATS: &Credentials{User: "worker-alpha", PasswordFile: filepath.Join(dir, "alpha.pass")}},
		},
		Models: map[string]*Model{
			"tagger": {Kind: KindTaggerPixAI, Dir: filepath.Join(dir, "models", "tagger"), General: 0.35, Character: 0.85,
				Files: map[string]string{"tags": "tags.csv"}},
			"detector": {Kind: KindDetect, Dir: filepath.Join(dir, "models", "detector"), Conf: 0.25, IoU: 0.7,
				Labels: []string{"person"}, Memory: 64 << 20, MaxBatch: 4},
			"ccip": {Kind: KindCCIP, HFRepo: "deepghs/ccip_onnx", HFRevision: "main"},
		},
	}
	c.SetOrder("pools", "zeta", "alpha")
	return c
}

// builtText is builtConfig as one would write it by hand: the keys it sets, no others.
const builtText = `
[nats]
embedded = true
listen = "127.0.0.1:0"
name = "rt"
user = "gateway"
password_file = "gw.pass"
tls_ca = "ca.pem"
inbox_prefix = "_INBOX_gateway"

[gateway]
id = "gw1"
http_listen = "127.0.0.1:0"
shutdown_grace = "3s"
restart_backoff_min = "250ms"
crash_loop_count = 100
policy = "fifo"
failover = true
http_hosts = ["ortbus.test"]
http_max_body = "1MiB"
http_max_concurrent = 4

[health]
heartbeat_interval = "100ms"
miss_count = 5

[security]
allowed_roots = ["images"]
spool_dir = "images/spool"
max_image_pixels = 1048576
max_image_bytes = "8MiB"
output_roots = ["out"]

[devices.cpu]
capacity = "300MiB"
safe_fraction = 0.5

[devices."cuda:0"]

[pools.zeta]
runtime = "ort/libonnxruntime.so.1"
runtime_dirs = ["ort2"]
env = { OMP_NUM_THREADS = "1" }
workers = 2
slots = 2
threads = 1
max_batch = 8
max_delay = "20ms"
nice = 10
classes = ["interactive", "batch", "bulk"]
models = ["tagger", "detector"]
path_map = { "/client" = "/srv/images" }

[pools.alpha]
local = false
ep = "cuda"
ep_options = { device_id = "0" }
fallback = ["cpu"]
classes = ["interactive"]
models = ["tagger", "ccip"]
nats = { user = "worker-alpha", password_file = "alpha.pass" }

[classes.batch]
chain = ["zeta"]
queue_bound = 10
timeout = "30s"
degrade = true
models = { tag = "tagger" }

[classes.bulk]
priority = 3
timeout = "1m"
shed = "drop_oldest"
min_share = 0.2
queue_bytes = "1MiB"

[models.tagger]
kind = "tagger-pixai"
dir = "models/tagger"
general_threshold = 0.35
character_threshold = 0.85
files = { tags = "tags.csv" }

[models.detector]
kind = "detect"
dir = "models/detector"
conf = 0.25
iou = 0.7
labels = ["person"]
memory = "64MiB"
max_batch = 4

[models.ccip]
kind = "ccip"
hf_repo = "deepghs/ccip_onnx"
hf_revision = "main"
`

// loadWritten writes c into dir and loads it back.
func loadWritten(t *testing.T, dir string, c *Config) *Config {
	t.Helper()
	p := filepath.Join(dir, "written.toml")
	if err := Write(p, c); err != nil {
		t.Fatal(err)
	}
	got, err := Load(p)
	if err != nil {
		b, _ := os.ReadFile(p)
		t.Fatalf("%v\nin the written file:\n%s", err, b)
	}
	return got
}

// unfiled is c without what tells where it was read from.
func unfiled(c *Config) *Config {
	x := *c
	x.File, x.lines, x.order = "", nil, nil
	return &x
}

// TestWriteBuilt: a configuration built in code, written and loaded, is what the same
// keys written by hand load as: its zero values get Load's defaults as left-out keys do
// (a standard class's priority and min_share, spool_max_age, reserve_window), and its
// pools keep the order set in code (the default chain of interactive follows it).
func TestWriteBuilt(t *testing.T) {
	dir := t.TempDir()
	got := loadWritten(t, dir, builtConfig(dir))
	want, err := Parse([]byte(builtText), filepath.Join(dir, "by-hand.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(unfiled(got), unfiled(want)) {
		a, _ := Marshal(got)
		b, _ := Marshal(want)
		t.Fatalf("written and loaded:\n%s\nwritten by hand:\n%s", a, b)
	}
	if p := got.PoolNames(); !slices.Equal(p, []string{"zeta", "alpha"}) {
		t.Errorf("pool order %v, want zeta, alpha (as set)", p)
	}
	if ch := got.Classes["interactive"].Chain; !slices.Equal(ch, []string{"zeta", "alpha"}) {
		t.Errorf("default interactive chain %v, want zeta, alpha", ch)
	}
	if b := got.Classes["batch"]; b.Priority != 2 || b.MinShare != 0.1 || got.Security.SpoolMaxAge.D() != DefaultSpoolMaxAge ||
		got.Gateway.ReserveWindow.D() != DefaultReserveWindow {
		t.Errorf("zero values did not get their defaults: batch priority %d min_share %v, spool_max_age %v, reserve_window %v",
			b.Priority, b.MinShare, got.Security.SpoolMaxAge, got.Gateway.ReserveWindow)
	}
	if !got.Pools["zeta"].IsLocal() || got.Pools["alpha"].IsLocal() || got.WorkerNATS("alpha").User != "worker-alpha" {
		t.Errorf("pools: %+v %+v", got.Pools["zeta"], got.Pools["alpha"])
	}
}

// TestWriteLoaded: a configuration that Load returned, written and loaded again, is the
// same (the same file once more): every example in deploy/, the built one, and one whose
// zeros are values of its own (spool files kept forever, a batch class of priority 0, the
// reservation off).
func TestWriteLoaded(t *testing.T) {
	var files []string
	filepath.WalkDir("../deploy", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".toml" {
			files = append(files, p)
		}
		return err
	})
	dir := t.TempDir()
	zeros := write(t, strings.NewReplacer(
		`spool_dir = "images/spool"`, `spool_dir = "images/spool"`+"\nspool_max_age = \"0s\"",
		"queue_bound = 10\n", "queue_bound = 10\npriority = 0\nmin_share = 0.0\n").Replace(good)+
		"\n[gateway]\nreserve_window = \"0s\"\n")
	files = append(files, zeros)
	if len(files) < 5 {
		t.Fatalf("deploy configs: %v", files)
	}
	configs := map[string]*Config{"built": loadWritten(t, dir, builtConfig(dir))}
	for _, f := range files {
		c, err := Load(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		configs[f] = c
	}
	for name, c := range configs {
		first, err := Marshal(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		again := loadWritten(t, dir, c)
		second, err := Marshal(again)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(first, second) {
			t.Errorf("%s: written:\n%s\nloaded and written again:\n%s", name, first, second)
		}
		if !slices.Equal(c.PoolNames(), again.PoolNames()) || strings.Join(c.Order("models", keys(c.Models)), ",") != strings.Join(again.Order("models", keys(again.Models)), ",") {
			t.Errorf("%s: order of pools %v or models changed: %v", name, c.PoolNames(), again.PoolNames())
		}
		if name == zeros {
			if b := again.Classes["batch"]; again.Security.SpoolMaxAge != 0 || b.Priority != 0 || b.MinShare != 0 || again.Gateway.ReserveWindow != 0 {
				t.Errorf("explicit zeros lost: spool_max_age %v, batch priority %d min_share %v, reserve_window %v",
					again.Security.SpoolMaxAge, b.Priority, b.MinShare, again.Gateway.ReserveWindow)
			}
		}
	}
}

// TestEditPool: keys of one pool's table replaced in place (comments kept) or added under
// its header; other tables, lines and comments untouched; an edit that makes the config
// invalid leaves the file as it was.
func TestEditPool(t *testing.T) {
	text := strings.Replace(good, `classes = ["interactive", "batch"]
models = ["tagger"]
env`, `classes = ["interactive", "batch"]
models = ["tagger"]
workers = 3   # a comment that stays
env`, 1)
	p := write(t, text)
	if err := EditPool(p, "cpu", map[string]string{"workers": "2", "threads": "1", "spin": "true"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	got := string(b)
	for _, want := range []string{"workers = 2   # a comment that stays", "[pools.cpu]\nspin = true\nthreads = 1\n", "[pools.cuda]\nep = \"cuda\""} {
		if !strings.Contains(got, want) {
			t.Errorf("edited file lacks %q:\n%s", want, got)
		}
	}
	c, err := Load(p)
	if err != nil || c.Pools["cpu"].Workers != 2 || c.Pools["cpu"].Threads != 1 || !c.Spins("cpu", 1) || c.Pools["cuda"].Threads != 0 {
		t.Fatalf("after the edit: %v %+v", err, c.Pools["cpu"])
	}
	if err := EditPool(p, "cpu", map[string]string{"workers": "-1"}); err == nil {
		t.Fatal("an invalid edit was written")
	}
	if b2, _ := os.ReadFile(p); string(b2) != got {
		t.Fatal("the file changed after a refused edit")
	}
	if err := EditPool(p, "nope", map[string]string{"workers": "1"}); err == nil {
		t.Fatal("an edit of a missing pool")
	}
}
