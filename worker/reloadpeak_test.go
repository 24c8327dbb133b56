package worker

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

const (
	reloadPeakLib = "ORTBUS_TEST_RELOAD_PEAK_LIB"
	reloadPeakDir = "ORTBUS_TEST_RELOAD_PEAK_DIR"
)

// TestReloadPeakMeasured: a model reloaded in place (loadInPlace: a new copy beside the
// serving one) is admitted at a real peak, never below the peak measured at its first load:
// a reload's own RSS growth under-counts it (the allocator reuses the pages the old copy
// freed), so the largest peak measured of the same files is kept as its floor (peaks.go,
// source rss-kept when it raised the measurement). Once its files change the model is
// measured afresh (source rss). In a child process of its own (one runtime per process),
// with the generated tagger (copied, so that its file can change) and max_batch 8
// (warm-ups at batch 1 and 8).
func TestReloadPeakMeasured(t *testing.T) {
	testenv.RunChild(t, "TestReloadPeakMeasuredChild",
		reloadPeakLib+"="+testenv.RuntimeLib(t, "1.30.0"),
		reloadPeakDir+"="+filepath.Join(testenv.Models(t), onnxgen.TaggerDir))
}

func TestReloadPeakMeasuredChild(t *testing.T) {
	if !testenv.InChild("TestReloadPeakMeasuredChild") {
		t.Skip("runs only as a child of TestReloadPeakMeasured")
	}
	rt, err := ort.Load(os.Getenv(reloadPeakLib))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(os.Getenv(reloadPeakDir))); err != nil {
		t.Fatal(err)
	}
	src := "[nats]\nurl = \"nats://127.0.0.1:1\"\n[pools.cpu]\nclasses = [\"batch\"]\nmax_batch = 8\nmodels = [\"tagger\"]\n" +
		"[models.tagger]\nkind = \"tagger-pixai\"\ndir = \"" + dir + "\"\n"
	c, err := config.Parse([]byte(src), "reload-peak.toml")
	if err != nil {
		t.Fatal(err)
	}
	p := c.Pools["cpu"]
	w := wire(c, p, "cpu-peak", slog.New(slog.NewTextHandler(io.Discard, nil)), rt, models.Env{Runtime: rt, Session: ort.PoolSessionConfig(p, false)})
	if err := w.loader.loadAll(0); err != nil {
		t.Fatal(err)
	}
	first, _ := status(w, "tagger")
	if first.State != codec.ModelReady || first.PeakSource != "rss" || first.PeakBytes <= 0 {
		t.Fatalf("tagger at start-up: %+v, want ready with its RSS peak", first)
	}
	reload := func(what string) codec.ModelStatus {
		st, err := w.loader.reload(c.Models["tagger"], 0, p.Models)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if hb, _ := status(w, "tagger"); hb.PeakBytes != st.PeakBytes || hb.PeakSource != st.PeakSource {
			t.Errorf("%s: heartbeat peak %s (%s), answered %s (%s)", what, mib(hb.PeakBytes), hb.PeakSource, mib(st.PeakBytes), st.PeakSource)
		}
		return st
	}
	admitted := first.PeakBytes
	for i := range 3 {
		st := reload(fmt.Sprintf("reload %d", i+1))
		t.Logf("peak at start-up %s, reload %d: %s (%s)", mib(first.PeakBytes), i+1, mib(st.PeakBytes), st.PeakSource)
		// Measured by this load (rss: it grew past the floor) or the floor kept (rss-kept),
		// never below what the model was admitted at before, so never below its first load.
		if (st.PeakSource != "rss" && st.PeakSource != "rss-kept") || st.PeakBytes < admitted {
			t.Errorf("reload %d: peak %s (%s), want rss or rss-kept, at least the %s admitted before (%s at start-up)", i+1, mib(st.PeakBytes), st.PeakSource, mib(admitted), mib(first.PeakBytes))
		}
		admitted = max(admitted, st.PeakBytes)
	}

	// The model's file changes (rewritten, a later modification time): measured afresh.
	onnx := filepath.Join(dir, "model.onnx")
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(onnx, later, later); err != nil {
		t.Fatal(err)
	}
	st := reload("reload after the file changed")
	t.Logf("reload after the file changed: %s (%s)", mib(st.PeakBytes), st.PeakSource)
	if st.PeakSource != "rss" || st.PeakBytes <= 0 {
		t.Errorf("reload after the file changed: peak %s (%s), want measured afresh by rss", mib(st.PeakBytes), st.PeakSource)
	}
}
