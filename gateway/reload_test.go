package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// TestAdmitChange: the memory admission of a change (reload.go, admitChange's rules), in
// process, on cuda:0 (1 GiB, 870.4 MiB of budget) where pool a's worker has measured its
// model tiny at 600 MiB: a model never measured counts the largest peak measured on the
// device (never 0), or its files' size when larger; an unload in the same change frees
// its model's peak; a reload needs room for one more copy; a declared memory counts as
// declared; what does not fit is refused overloaded, naming the device.
func TestAdmitChange(t *testing.T) {
	dir := t.TempDir()
	small, large := filepath.Join(dir, "small"), filepath.Join(dir, "large")
	for d, size := range map[string]int64{small: 1 << 10, large: 700 * mib} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(d, "model.onnx"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil { // sparse: its size, not its blocks
			t.Fatal(err)
		}
		f.Close()
	}
	g := testGateway(t, `
[nats]
url = "nats://127.0.0.1:1"
[security]
allowed_roots = ["/srv"]
[devices."cuda:0"]
capacity = "1GiB"
[pools.a]
device = "cuda:0"
classes = ["interactive"]
models = ["tiny"]
[models.tiny]
kind = "raw"
dir = "`+small+`"
[models.unmeasured]
kind = "raw"
dir = "`+small+`"
[models.weighty]
kind = "raw"
dir = "`+large+`"
[models.declared]
kind = "raw"
dir = "`+large+`"
memory = "100MiB"
`)
	newFleet(t, g).beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1,
		Models: []codec.ModelStatus{{Name: "tiny", State: codec.ModelReady, Loaded: true, PeakBytes: 600 * mib}}})
	cur := g.conf()
	with := func(models ...string) *config.Config {
		t.Helper()
		next, err := cur.WithPoolModels("a", models)
		if err != nil {
			t.Fatal(err)
		}
		return next
	}
	if p := g.reloader.peakOf(cur, "cuda:0", "unmeasured"); p != 600*mib {
		t.Errorf("peak of a model never measured, small files: %d MiB, want the device's largest measured (600)", p/mib)
	}
	if p := g.reloader.peakOf(cur, "cuda:0", "weighty"); p != 700*mib {
		t.Errorf("peak of a model never measured, 700 MiB of files: %d MiB, want its files' size", p/mib)
	}
	for _, c := range []struct {
		what string
		next *config.Config
		ch   config.ModelChanges
		ok   bool
	}{
		{"load a model never measured (600 MiB counted; 270 left)", with("tiny", "unmeasured"), config.ModelChanges{Load: []string{"unmeasured"}}, false},
		{"the same with tiny unloaded (its 600 MiB freed)", with("unmeasured"), config.ModelChanges{Load: []string{"unmeasured"}, Unload: []string{"tiny"}}, true},
		{"load a model of declared memory (100 MiB)", with("tiny", "declared"), config.ModelChanges{Load: []string{"declared"}}, true},
		{"reload tiny (a second copy of 600 MiB beside the first)", cur, config.ModelChanges{Reload: []string{"tiny"}}, false},
	} {
		e := g.reloader.admitChange(c.next, &config.Changes{Models: map[string]config.ModelChanges{"a": c.ch}})
		switch {
		case c.ok && e != nil:
			t.Errorf("%s: refused: %v", c.what, e)
		case !c.ok && (e == nil || e.Code != codec.CodeOverloaded || !strings.Contains(e.Message, "device cuda:0")):
			t.Errorf("%s: %v, want refused overloaded naming the device", c.what, e)
		}
	}
}
