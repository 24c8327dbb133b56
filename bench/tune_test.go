package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestLayouts: the sweep on 2 and 4 cores (workers × threads within the cores, spin off
// and on, max_batch 8 only where the op batches).
func TestLayouts(t *testing.T) {
	if n := len(layouts(2, false)); n != 6 {
		t.Errorf("2 cores: %d layouts, want 6 (1×1, 1×2, 2×1; spin off, on)", n)
	}
	l := layouts(4, true)
	for _, x := range l {
		if x.Workers*x.Threads > 4 {
			t.Errorf("layout %v past 4 cores", x)
		}
	}
	if len(l) != 2*2*8 { // (w,t) in 1×1..1×4, 2×1, 2×2, 3×1, 4×1: 8 pairs
		t.Errorf("4 cores, batching: %d layouts, want 32", len(l))
	}
}

// TestTuneTiny: ortbus tune on a pool of the tiny model measures every layout through a
// real gateway and workers, picks the fastest, and -write puts it in the file's pool
// table (the rest of the file unchanged), which then loads.
func TestTuneTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway per layout; skipped with -short")
	}
	root := testenv.RepoRoot(t)
	lib := testenv.RuntimeLib(t, RuntimeVersion)
	bin := buildSystem(t, root)
	md := testenv.Models(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "tiny.toml")
	text := `# a comment that stays
[nats]
embedded = true

[security]
allowed_roots = ["` + dir + `"]

[models.tiny]
kind = "raw"
dir = "` + filepath.Join(md, onnxgen.TinyDir) + `"

[pools.p]
runtime = "` + lib + `"
workers = 1
threads = 1
classes = ["interactive"]
models = ["tiny"]
`
	if err := os.WriteFile(cfgPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Tune(ctx, TuneOptions{Options: Options{Repo: root, BinDir: bin, Out: &out}, Config: cfgPath, Pool: "p",
		Inputs: map[string]string{"x": "zeros:1x4"}, Duration: 300 * time.Millisecond, Write: true})
	t.Logf("tune:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != len(layouts(2, false)) && len(res.Rows) < 6 {
		t.Fatalf("%d rows", len(res.Rows))
	}
	for _, r := range res.Rows {
		if r.Err != "" || r.ItemsPerSec <= 0 || r.P95MS < r.P50MS {
			t.Errorf("layout %v: %+v", r.Layout, r)
		}
		if r.ItemsPerSec > res.Winner.ItemsPerSec {
			t.Errorf("winner %v at %.1f/s, but %v ran %.1f/s", res.Winner.Layout, res.Winner.ItemsPerSec, r.Layout, r.ItemsPerSec)
		}
	}
	c, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	p, w := c.Pools["p"], res.Winner.Layout
	if !res.Written || p.Workers != w.Workers || p.Threads != w.Threads || max(1, p.MaxBatch) != w.MaxBatch || c.Spins("p", 64) != w.Spin {
		t.Errorf("written pool %+v, want the winner %v", p, w)
	}
	if b, _ := os.ReadFile(cfgPath); !strings.HasPrefix(string(b), "# a comment that stays\n") {
		t.Error("the file's comment is gone")
	}
}
