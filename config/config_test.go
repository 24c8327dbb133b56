package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/subjects"
)

const good = `
[nats]
embedded = true
listen = "127.0.0.1:0"

[security]
allowed_roots = ["images"]
spool_dir = "images/spool"

[models.tagger]
kind = "tagger-pixai"
dir = "models/tagger"

[pools.cpu]
runtime = "../ort/lib/libonnxruntime.so.1"
classes = ["interactive", "batch"]
models = ["tagger"]
env = { OMP_NUM_THREADS = "1" }

[pools.cuda]
ep = "cuda"
fallback = ["cpu"]
classes = ["batch"]
models = ["tagger"]
local = false

[classes.batch]
chain = ["cuda", "cpu"]
queue_bound = 10
timeout = "30s"
`

func write(t *testing.T, text string) string {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "ortbus.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadGood(t *testing.T) {
	p := write(t, good)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(p)
	if got := c.Security.AllowedRoots[0]; got != filepath.Join(dir, "images") {
		t.Fatalf("root not resolved against the file: %s", got)
	}
	if got := c.Pools["cpu"].Runtime; got != filepath.Join(filepath.Dir(dir), "ort/lib/libonnxruntime.so.1") {
		t.Fatalf("runtime = %s", got)
	}
	cpu, cuda := c.Pools["cpu"], c.Pools["cuda"]
	if cpu.Workers != 1 || cpu.Slots != 1 || cpu.Device != "cpu" || !cpu.IsLocal() || cpu.Env["OMP_NUM_THREADS"] != "1" {
		t.Fatalf("cpu defaults: %+v", cpu)
	}
	if cuda.Device != "cuda:0" || cuda.IsLocal() || cuda.Workers != 0 {
		t.Fatalf("cuda defaults: %+v", cuda)
	}
	if got := c.Classes["interactive"].Chain; len(got) != 1 || got[0] != "cpu" {
		t.Fatalf("default interactive chain = %v", got)
	}
	if b := c.Classes["batch"]; b.QueueBound != 10 || b.Timeout.D() != 30*time.Second || b.Priority != 2 {
		t.Fatalf("batch class: %+v", b)
	}
	if got := c.ClassNames(); strings.Join(got, ",") != "urgent,interactive,batch" {
		t.Fatalf("class order %v", got)
	}
	if got := c.PoolNames(); strings.Join(got, ",") != "cpu,cuda" {
		t.Fatalf("pool order %v", got)
	}
	if c.Health.HeartbeatInterval.D() != time.Second || c.Health.MissCount != 3 {
		t.Fatalf("health defaults %+v", c.Health)
	}
}

func TestLoadBad(t *testing.T) {
	cases := []struct {
		edit func(string) string
		at   string // the text on the line the error must name ("" = no line check)
		want string
	}{
		{func(s string) string { return strings.Replace(s, "queue_bound = 10", "queue_bund = 10", 1) }, "queue_bund", "classes.batch.queue_bund: unknown key"},
		{func(s string) string { return strings.Replace(s, `timeout = "30s"`, `timeout = "soon"`, 1) }, `"soon"`, "not a duration"},
		{func(s string) string { return strings.Replace(s, `ep = "cuda"`, `ep = "cudaa"`, 1) }, `"cudaa"`, `unknown execution provider "cudaa"`},
		{func(s string) string { return strings.Replace(s, `chain = ["cuda", "cpu"]`, `chain = ["gpu"]`, 1) }, `["gpu"]`, `unknown pool "gpu"`},
		{func(s string) string {
			return strings.Replace(s, `models = ["tagger"]`+"\nenv", `models = ["nope"]`+"\nenv", 1)
		}, `["nope"]`, `unknown model "nope"`},
		{func(s string) string { return strings.Replace(s, `kind = "tagger-pixai"`, `kind = "magic"`, 1) }, `"magic"`, `unknown model kind "magic"`},
		{func(s string) string { return strings.Replace(s, "[pools.cpu]", "[pools.\"c.pu\"]", 1) }, "c.pu", "contains a dot"},
		{func(s string) string {
			return strings.Replace(s, `spool_dir = "images/spool"`, `spool_dir = "/elsewhere"`, 1)
		}, "/elsewhere", "not inside any of allowed_roots"},
		{func(s string) string { return strings.Replace(s, `embedded = true`, ``, 1) }, "[nats]", "set url"},
		{func(s string) string { return strings.Replace(s, "slots", "slots", 1) + "[pools.cpu.extra]\nx = 1\n" }, "", "unknown key"},
		{func(s string) string { return s + "\n[classes.batch]\n" }, "", "already"},
		{func(s string) string {
			return strings.Replace(s, "local = false", "local = false\ndecode_threads = -1", 1)
		}, "decode_threads", "decode_threads: must be in 0..1024"},
		{func(s string) string {
			return strings.Replace(s, "local = false", "local = false\ndecode_threads = 5000", 1)
		}, "decode_threads", "must be in 0..1024"},
		{func(s string) string {
			return strings.Replace(s, "local = false", "local = false\ndecode_threads = \"two\"", 1)
		}, "decode_threads", "decode_threads"},
		{func(s string) string {
			return strings.Replace(s, "[pools.cpu]\n", "[pools.cpu]\ncpu_fallback = false\n", 1)
		}, "cpu_fallback", "pools.cpu.cpu_fallback: false needs an ep other than cpu"},
		{func(s string) string {
			return strings.Replace(s, "[pools.cpu]\n", "[pools.cpu]\ncpu_fallback = \"no\"\n", 1)
		}, "cpu_fallback", "cpu_fallback"},
		{func(s string) string { return s + "\n[devices.cpu]\nsafe_fraction = 1.5\n" }, "safe_fraction", "must be in (0, 1]"},
		{func(s string) string { return s + "\n[classes.batch.models]\nembed = \"tagger\"\n" }, "embed =", `model "tagger" (tagger-pixai) does not serve op "embed"`},
	}
	for i, tc := range cases {
		text := tc.edit(good)
		_, err := Load(write(t, text))
		if err == nil {
			t.Fatalf("case %d: accepted", i)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("case %d: error %q does not say %q", i, err, tc.want)
		}
		if tc.at != "" {
			line := strings.Count(text[:strings.Index(text, tc.at)], "\n") + 1
			if !strings.Contains(err.Error(), fmt.Sprintf(".toml:%d:", line)) {
				t.Fatalf("case %d: error %q does not name line %d", i, err, line)
			}
		}
	}
}

func TestBytes(t *testing.T) {
	for in, want := range map[string]Bytes{"512MiB": 512 << 20, "2GB": 2e9, "8G": 8 << 30, "100": 100, "1.5KiB": 1536} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Fatalf("%s = %d, %v", in, got, err)
		}
	}
	if _, err := ParseBytes("lots"); err == nil {
		t.Fatal("bad size accepted")
	}
}

func TestPoolCredentialsAndInboxPrefix(t *testing.T) {
	text := strings.Replace(good, "listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:0\"\nuser = \"gateway\"\ninbox_prefix = \"_INBOX_gateway\"", 1) +
		"\n[pools.cpu.nats]\nuser = \"worker-cpu\"\npassword_file = \"secrets/worker-cpu.pass\"\n"
	p := write(t, text)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.NATS.InboxPrefix != "_INBOX_gateway" {
		t.Fatalf("inbox_prefix = %q", c.NATS.InboxPrefix)
	}
	w := c.WorkerNATS("cpu")
	if w.User != "worker-cpu" || w.PasswordFile != filepath.Join(filepath.Dir(p), "secrets", "worker-cpu.pass") || w.InboxPrefix != "" || w.Listen != c.NATS.Listen {
		t.Fatalf("pool cpu's NATS section %+v", w)
	}
	if w := c.WorkerNATS("cuda"); !reflect.DeepEqual(w, c.NATS) {
		t.Fatalf("a pool without credentials gets %+v, want [nats] %+v", w, c.NATS)
	}
	for i, tc := range []struct{ edit, want string }{
		{"\n[pools.cpu.nats]\nuser = \"worker-cpu\"\n", "needs a password_file"},
		{"\n[pools.cpu.nats]\npassword_file = \"p\"\n", "set user"},
		{"\n[pools.cpu.nats]\ncreds_file = \"c\"\nuser = \"u\"\npassword_file = \"p\"\n", "not both"},
		{"\n[pools.cpu.nats]\nurl = \"nats://x\"\n", "unknown key"},
	} {
		if _, err := Load(write(t, good+tc.edit)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("case %d: %v, want an error with %q", i, err, tc.want)
		}
	}
	for _, bad := range []string{"_INBOX.>", "_INBOX_a.*", "_INBOX_a.", "a b"} {
		_, err := Load(write(t, strings.Replace(good, "[nats]", "[nats]\ninbox_prefix = \""+bad+"\"", 1)))
		if err == nil || !strings.Contains(err.Error(), "nats.inbox_prefix") {
			t.Errorf("inbox_prefix %q: %v, want refused", bad, err)
		}
	}
	if _, err := Load(write(t, good+"\n[pools.cpu.nats]\ncreds_file = \"worker-cpu.creds\"\n")); err != nil {
		t.Errorf("creds_file alone: %v", err)
	}
}

// TestReplyPrefixes: the defaults, a configured list replacing them, inbox_prefix always
// accepted, and malformed prefixes refused with their key.
func TestReplyPrefixes(t *testing.T) {
	c, err := Load(write(t, good))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.NATS.Replies(); !reflect.DeepEqual(got, subjects.DefaultReplyPrefixes) {
		t.Fatalf("default replies %v", got)
	}
	c, err = Load(write(t, strings.Replace(good, "[nats]", "[nats]\ninbox_prefix = \"_INBOX_gw\"\nreply_prefixes = [\"_INBOX_app1\", \"_R_\"]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.NATS.Replies(); !reflect.DeepEqual(got, []string{"_INBOX_app1", "_R_", "_INBOX_gw"}) {
		t.Fatalf("configured replies %v", got)
	}
	if subjects.CheckReply("_INBOX.abc.1", c.NATS.Replies()) == nil {
		t.Fatal("the default _INBOX accepted though reply_prefixes replaced it")
	}
	for _, bad := range []string{"", "_INBOX.>", "a.*", "a.", ".a", "a b"} {
		_, err := Load(write(t, strings.Replace(good, "[nats]", "[nats]\nreply_prefixes = [\""+bad+"\"]", 1)))
		if err == nil || !strings.Contains(err.Error(), "nats.reply_prefixes") {
			t.Errorf("reply_prefixes [%q]: %v, want refused", bad, err)
		}
	}
}

// TestReserveWindow: gateway.reserve_window defaults to DefaultReserveWindow, takes a
// duration, keeps "0s" (the reservation off) as a value of its own, and refuses a
// negative one, naming its line.
func TestReserveWindow(t *testing.T) {
	for _, tc := range []struct {
		gateway string // the [gateway] section's lines, if any
		want    time.Duration
	}{
		{"", DefaultReserveWindow},
		{`reserve_window = "500ms"`, 500 * time.Millisecond},
		{`reserve_window = "0s"`, 0},
	} {
		c, err := Load(write(t, good+"\n[gateway]\n"+tc.gateway+"\n"))
		if err != nil {
			t.Fatalf("%q: %v", tc.gateway, err)
		}
		if got := c.Gateway.ReserveWindow.D(); got != tc.want {
			t.Errorf("%q: reserve_window %v, want %v", tc.gateway, got, tc.want)
		}
	}
	text := good + "\n[gateway]\nreserve_window = \"-1s\"\n"
	_, err := Load(write(t, text))
	line := strings.Count(text, "\n")
	if err == nil || !strings.Contains(err.Error(), "gateway.reserve_window: must not be negative") || !strings.Contains(err.Error(), fmt.Sprintf(".toml:%d:", line)) {
		t.Fatalf("negative reserve_window: %v, want an error naming line %d", err, line)
	}
}

// decode_threads: as set, else the cores the pool's intra-op threads leave free, at
// least 1.
func TestDecodeWorkers(t *testing.T) {
	for i, tc := range []struct {
		p    Pool
		cpus int
		want int
	}{
		{Pool{DecodeThreads: 3, Slots: 1, Threads: 8}, 8, 3},
		{Pool{Slots: 1, Threads: 1}, 8, 7},
		{Pool{Slots: 2, Threads: 2}, 8, 4},
		{Pool{Slots: 1, Threads: 0}, 8, 1},
		{Pool{Slots: 4, Threads: 4}, 8, 1},
		{Pool{Slots: 0, Threads: 1}, 2, 1},
	} {
		if got := tc.p.DecodeWorkers(tc.cpus); got != tc.want {
			t.Errorf("case %d: %+v on %d cores: %d decode workers, want %d", i, tc.p, tc.cpus, got, tc.want)
		}
	}
}
