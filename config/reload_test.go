package config

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDiff: what a reload applies (pools added, removed and replaced, with why; class
// chains; devices) and what it refuses (sections read once at start, a class's queue),
// each named.
func TestDiff(t *testing.T) {
	path := write(t, good) // each version in the same file, as a reload reads it
	parse := func(text string) *Config {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cur := parse(good)
	if ch, err := Diff(cur, parse(good)); err != nil || !ch.Empty() || ch.String() != "no change" {
		t.Fatalf("same file: %v %v", ch, err)
	}

	next := strings.Replace(good, "[pools.cuda]", `[models.ccip]
kind = "ccip"
dir = "models/ccip"

[pools.gpu2]
classes = ["batch"]
models = ["ccip"]

[pools.cuda]`, 1)
	next = strings.Replace(next, `models = ["tagger"]
env`, `models = ["tagger", "ccip"]
env`, 1)
	next = strings.Replace(next, `chain = ["cuda", "cpu"]`, `chain = ["cuda", "cpu", "gpu2"]`, 1)
	ch, err := Diff(cur, parse(next))
	if err != nil {
		t.Fatal(err)
	}
	// ccip loaded into cpu in place: cpu's workers are kept, not replaced.
	if !slices.Equal(ch.Added, []string{"gpu2"}) || len(ch.Removed) != 0 || len(ch.Changed) != 0 ||
		!slices.Equal(ch.Models["cpu"].Load, []string{"ccip"}) || len(ch.Models["cpu"].Unload)+len(ch.Models["cpu"].Reload) != 0 || len(ch.Models) != 1 ||
		!slices.Equal(ch.Routing, []string{"class batch changed"}) || !slices.Equal(ch.Pools(), []string{"gpu2"}) ||
		ch.InPlace()["cpu"] != "models +ccip" || !strings.Contains(ch.String(), "pool cpu: models +ccip (in place)") {
		t.Fatalf("added gpu2, ccip on cpu, a chain: %+v (%s)", ch, ch)
	}

	// A model's table changed: every pool that loads it reloads it in place.
	ch, err = Diff(cur, parse(strings.Replace(good, `dir = "models/tagger"`, `dir = "models/tagger2"`, 1)))
	if err != nil || len(ch.Changed) != 0 || !slices.Equal(ch.Models["cpu"].Reload, []string{"tagger"}) || !slices.Equal(ch.Models["cuda"].Reload, []string{"tagger"}) ||
		ch.InPlace()["cpu"] != "model tagger reloaded" {
		t.Fatalf("tagger's dir changed: %+v %v", ch, err)
	}
	// One change of each kind in one pool: loaded (anywhere in the list), unloaded,
	// reloaded, in place.
	three := strings.Replace(good, "[pools.cpu]", `[models.ccip]
kind = "ccip"
dir = "models/ccip"

[models.det]
kind = "detect"
dir = "models/det"

[pools.cpu]`, 1)
	if cur3, err := Diff(cur, parse(strings.Replace(three, `models = ["tagger"]
env`, `models = ["ccip", "tagger", "det"]
env`, 1))); err != nil || len(cur3.Models["cpu"].Load) != 2 {
		t.Fatalf("ccip and det loaded: %+v %v", cur3, err)
	}
	base := parse(strings.Replace(three, `models = ["tagger"]
env`, `models = ["tagger", "ccip"]
env`, 1))
	next3 := strings.Replace(three, `models = ["tagger"]
env`, `models = ["det", "tagger"]
env`, 1)
	next3 = strings.Replace(next3, `dir = "models/tagger"`, `dir = "models/tagger2"`, 1)
	ch, err = Diff(base, parse(next3))
	if want := (ModelChanges{Load: []string{"det"}, Unload: []string{"ccip"}, Reload: []string{"tagger"}}); err != nil || !reflect.DeepEqual(ch.Models["cpu"], want) ||
		len(ch.Changed) != 0 || len(ch.Models["cuda"].Reload) != 1 || ch.InPlace()["cpu"] != "models +det -ccip; model tagger reloaded" {
		t.Fatalf("det loaded, ccip unloaded, tagger reloaded: %+v %v", ch, err)
	}
	// The models kept, reordered: an order is not a change (the workers keep theirs).
	reorder := strings.Replace(three, `models = ["tagger"]
env`, `models = ["ccip", "tagger"]
env`, 1)
	if ch, err = Diff(base, parse(reorder)); err != nil || !ch.Empty() || ch.String() != "no change" {
		t.Fatalf("models reordered: %+v %v, want no change", ch, err)
	}
	// Reordered and one added: det loaded in place, nothing replaced.
	if ch, err = Diff(base, parse(strings.Replace(three, `models = ["tagger"]
env`, `models = ["ccip", "det", "tagger"]
env`, 1))); err != nil || len(ch.Changed) != 0 || !reflect.DeepEqual(ch.Models["cpu"], ModelChanges{Load: []string{"det"}}) {
		t.Fatalf("models reordered and one added: %+v %v, want det loaded in place", ch, err)
	}
	// A pool removed (and its class's chain with it).
	removed := strings.Replace(good, `chain = ["cuda", "cpu"]`, `chain = ["cpu"]`, 1)
	removed = removed[:strings.Index(removed, "[pools.cuda]")] + removed[strings.Index(removed, "[classes.batch]"):]
	ch, err = Diff(cur, parse(removed))
	if err != nil || !slices.Equal(ch.Removed, []string{"cuda"}) {
		t.Fatalf("cuda removed: %+v %v", ch, err)
	}
	// A pool's own table.
	if ch, err = Diff(cur, parse(strings.Replace(good, `OMP_NUM_THREADS = "1"`, `OMP_NUM_THREADS = "2"`, 1))); err != nil || ch.Changed["cpu"] != "pool table changed" {
		t.Fatalf("cpu's env: %+v %v", ch, err)
	}

	// Refused, each named; nothing applies.
	for edit, want := range map[[2]string]string{
		{`listen = "127.0.0.1:0"`, `listen = "127.0.0.1:4333"`}:       "[nats]",
		{`queue_bound = 10`, `queue_bound = 11`}:                      "[classes.batch] priority or queue",
		{`spool_dir = "images/spool"`, `spool_dir = "images/spool2"`}: "[security]",
	} {
		_, err := Diff(cur, parse(strings.Replace(good, edit[0], edit[1], 1)))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "restart the gateway") {
			t.Errorf("%s: %v, want refused naming %s", edit[1], err, want)
		}
	}
}

// TestWithPoolModels: a pool's model list replaced in a copy, the rest shared; unknown
// pools and models refused.
func TestWithPoolModels(t *testing.T) {
	c, err := Load(write(t, good))
	if err != nil {
		t.Fatal(err)
	}
	next, err := c.WithPoolModels("cpu", nil)
	if err != nil || len(next.Pools["cpu"].Models) != 0 || len(c.Pools["cpu"].Models) != 1 || next.Pools["cuda"] != c.Pools["cuda"] {
		t.Fatalf("unload tagger from cpu: %v; cpu %v (in force %v)", err, next.Pools["cpu"].Models, c.Pools["cpu"].Models)
	}
	if ch, err := Diff(c, next); err != nil || len(ch.Changed) != 0 || !slices.Equal(ch.Models["cpu"].Unload, []string{"tagger"}) {
		t.Fatalf("diff: %+v %v", ch, err)
	}
	if _, err := c.WithPoolModels("nope", nil); err == nil {
		t.Error("an unknown pool taken")
	}
	if _, err := c.WithPoolModels("cpu", []string{"nope"}); err == nil {
		t.Error("an unknown model taken")
	}
	many := make([]string, 65)
	for i := range many {
		many[i] = "tagger"
	}
	if _, err := c.WithPoolModels("cpu", many); err == nil || !strings.Contains(err.Error(), "at most 64 models") {
		t.Errorf("65 models in a pool: %v", err)
	}
}

// TestParseModel: a model's table goes to a worker as TOML (MarshalModel) and comes back
// the same (ParseModel), validated as the file's models are; what the file would refuse,
// an unknown key, a relative dir and an oversized table are refused, each with the key.
func TestParseModel(t *testing.T) {
	c, err := Load(write(t, good+`
[models.det]
kind = "detect"
dir = "models/det"
files = { model = "m.onnx" }
conf = 0.5
labels = ["a", "b"]
memory = "64MiB"
max_batch = 4
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tagger", "det"} {
		b, err := MarshalModel(c.Models[name])
		if err != nil {
			t.Fatal(err)
		}
		m, err := ParseModel(name, b)
		if err != nil || !reflect.DeepEqual(m, c.Models[name]) {
			t.Fatalf("%s: %+v %v, want %+v (table %s)", name, m, err, c.Models[name], b)
		}
	}
	for table, want := range map[string]string{
		`kind = "nope"` + "\ndir = \"/m\"":                "unknown model kind",
		`kind = "raw"`:                                    "set dir",
		`kind = "raw"` + "\ndir = \"m\"":                  "is relative",
		`kind = "raw"` + "\ndir = \"/m\"\nconf = 2":       "conf",
		`kind = "raw"` + "\ndir = \"/m\"\nextra = 1":      "unknown key",
		`kind = "raw"` + "\ndir = \"/m\"\nmax_batch = -1": "max_batch",
		"kind = [":                  "models.x",
		strings.Repeat("#", 65<<10): "over the limit",
	} {
		if _, err := ParseModel("x", []byte(table)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("table %.40q: %v, want refused naming %q", table, err, want)
		}
	}
	if _, err := ParseModel("a.b", []byte(`kind = "raw"`+"\ndir = \"/m\"")); err == nil {
		t.Error("a model name that is no subject token taken")
	}
}

// FuzzParseModel: a worker reads a model's table from the wire: hostile text is an error,
// never a panic, and a table it takes is valid.
func FuzzParseModel(f *testing.F) {
	for _, s := range []string{`kind = "raw"` + "\ndir = \"/m\"", `kind = "detect"` + "\ndir = \"/m\"\nlabels = [\"a\"]\nmemory = \"1GiB\"", "kind = [", "= ="} {
		f.Add("m", []byte(s))
	}
	f.Fuzz(func(t *testing.T, name string, table []byte) {
		m, err := ParseModel(name, table)
		if err == nil && (m.Name != name || (m.Dir == "" && m.HFRepo == "")) {
			t.Fatalf("took %+v", m)
		}
	})
}

// TestSpins: spin true and false decide; "auto" (and no key) spins only while the local
// pools' threads (workers × slots × threads) leave a core free, and never beside a pool
// whose threads are the runtime's default; a remote pool takes no local core; anything
// else is refused.
func TestSpins(t *testing.T) {
	pool := func(workers, slots, threads int, spin any) *Pool {
		return &Pool{Workers: workers, Slots: slots, Threads: threads, Spin: spin}
	}
	remote := pool(8, 8, 8, nil)
	f := false
	remote.Local = &f
	for _, c := range []struct {
		pools map[string]*Pool
		cpus  int
		want  bool
	}{
		{map[string]*Pool{"p": pool(1, 1, 1, nil)}, 2, true},
		{map[string]*Pool{"p": pool(1, 1, 2, nil)}, 2, false},
		{map[string]*Pool{"p": pool(1, 1, 2, SpinAuto)}, 4, true},
		{map[string]*Pool{"p": pool(1, 1, 2, true)}, 2, true},
		{map[string]*Pool{"p": pool(1, 1, 1, false)}, 16, false},
		{map[string]*Pool{"p": pool(2, 2, 1, nil)}, 4, false},
		{map[string]*Pool{"p": pool(1, 1, 1, nil), "q": pool(1, 1, 0, nil)}, 64, false},
		{map[string]*Pool{"p": pool(1, 1, 1, nil), "r": remote}, 2, true},
	} {
		cfg := &Config{Pools: c.pools}
		if got := cfg.Spins("p", c.cpus); got != c.want {
			t.Errorf("pools %v on %d cores: spins %v, want %v", c.pools, c.cpus, got, c.want)
		}
	}
	bad := strings.Replace(good, `env = { OMP_NUM_THREADS = "1" }`, `env = { OMP_NUM_THREADS = "1" }
spin = "yes"`, 1)
	if _, err := Load(write(t, bad)); err == nil || !strings.Contains(err.Error(), "spin") {
		t.Fatalf("spin = \"yes\": %v, want refused", err)
	}
	ok := strings.Replace(good, `env = { OMP_NUM_THREADS = "1" }`, `env = { OMP_NUM_THREADS = "1" }
spin = true`, 1)
	if c, err := Load(write(t, ok)); err != nil || !c.Spins("cpu", 1) {
		t.Fatalf("spin = true: %v", err)
	}
}

// TestSyncRoots: outputs are fsynced under the output roots by default, not in the spool;
// fsync_roots names the write roots to sync, and refuses any other directory.
func TestSyncRoots(t *testing.T) {
	c, err := Load(write(t, good))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Security.SyncRoots()) != 0 {
		t.Fatalf("default: %v, want none (no output_roots; the spool is not synced)", c.Security.SyncRoots())
	}
	withSpool := strings.Replace(good, `spool_dir = "images/spool"`, `spool_dir = "images/spool"
fsync_roots = ["images/spool"]`, 1)
	p := write(t, withSpool)
	if c, err = Load(p); err != nil || len(c.Security.SyncRoots()) != 1 || c.Security.SyncRoots()[0] != c.Security.SpoolDir {
		t.Fatalf("fsync_roots = the spool: %v %v", err, c.Security.SyncRoots())
	}
	bad := strings.Replace(good, `spool_dir = "images/spool"`, `spool_dir = "images/spool"
fsync_roots = ["/elsewhere"]`, 1)
	if _, err := Load(write(t, bad)); err == nil || !strings.Contains(err.Error(), "fsync_roots") {
		t.Fatalf("fsync_roots outside the write roots: %v", err)
	}
}

// TestPoolModelBound: a pool of more models than a heartbeat may list is refused at load
// (its worker would never be heard as live).
func TestPoolModelBound(t *testing.T) {
	models := make([]string, 65)
	var tables strings.Builder
	for i := range models {
		models[i] = fmt.Sprintf("m%d", i)
		fmt.Fprintf(&tables, "[models.m%d]\nkind = \"raw\"\ndir = \"models/m%d\"\n\n", i, i)
	}
	text := strings.Replace(good, `models = ["tagger"]
env`, `models = ["`+strings.Join(models, `", "`)+`"]
env`, 1) + "\n" + tables.String()
	if _, err := Load(write(t, text)); err == nil || !strings.Contains(err.Error(), "at most 64 models") {
		t.Fatalf("65 models in a pool: %v", err)
	}
}

// TestJobWindows: quiet hours in a day and across midnight; none means always; a window
// that is not HH:MM-HH:MM, or is empty, is refused.
func TestJobWindows(t *testing.T) {
	at := func(hm string) time.Time {
		tm, _ := time.Parse("15:04", hm)
		return time.Date(2026, 12, 3, tm.Hour(), tm.Minute(), 0, 0, time.Local)
	}
	j := &Jobs{Windows: []string{"22:00-07:00", "12:30-13:00"}}
	for hm, want := range map[string]bool{"23:10": true, "00:00": true, "06:59": true, "07:00": false, "12:00": false, "12:30": true, "12:59": true, "13:00": false, "21:59": false} {
		if got := j.InWindow(at(hm)); got != want {
			t.Errorf("%s: in window %v, want %v", hm, got, want)
		}
	}
	if !(&Jobs{}).InWindow(at("15:00")) {
		t.Error("no windows: not always")
	}
	for _, bad := range []string{"22-07", "25:00-07:00", "07:00-07:00", "x"} {
		text := good + "\n[jobs]\nwindows = [\"" + bad + "\"]\n"
		if _, err := Load(write(t, text)); err == nil || !strings.Contains(err.Error(), "jobs.windows") {
			t.Errorf("window %q: %v, want refused", bad, err)
		}
	}
}

// TestDiffAfterRunTimeModels: `ortbus reload` of the unchanged file after an operator
// unloaded a model at run time and loaded it again (WithPoolModels, as the gateway's model
// operations do: the model comes back at the end of each pool's list) changes nothing: the
// same models in another order replace no pool ("models reordered" restarted both).
func TestDiffAfterRunTimeModels(t *testing.T) {
	text := strings.Replace(good, "[pools.cpu]", `[models.ccip]
kind = "ccip"
dir = "models/ccip"

[pools.cpu]`, 1)
	text = strings.Replace(text, `models = ["tagger"]
env`, `models = ["tagger", "ccip"]
env`, 1)
	file, err := Load(write(t, text))
	if err != nil {
		t.Fatal(err)
	}
	cur := file
	for _, pool := range []string{"cpu", "cuda"} {
		ms := cur.Pools[pool].Models
		if !slices.Contains(ms, "tagger") {
			t.Fatalf("pool %s does not load tagger: %v", pool, ms)
		}
		if cur, err = cur.WithPoolModels(pool, slices.DeleteFunc(slices.Clone(ms), func(m string) bool { return m == "tagger" })); err != nil {
			t.Fatal(err)
		}
		if cur, err = cur.WithPoolModels(pool, append(slices.Clone(cur.Pools[pool].Models), "tagger")); err != nil {
			t.Fatal(err)
		}
	}
	if slices.Equal(cur.Pools["cpu"].Models, file.Pools["cpu"].Models) {
		t.Fatalf("pool cpu's models %v: the run-time unload and load did not reorder them", cur.Pools["cpu"].Models)
	}
	ch, err := Diff(cur, file)
	if err != nil || !ch.Empty() || len(ch.Pools()) != 0 {
		t.Fatalf("reload of the unchanged file after a run-time unload and load: %+v (%s) %v, want no change", ch, ch, err)
	}
}
