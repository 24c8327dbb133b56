package worker

import (
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
// serving one) reports a real peak, measured by RSS as at start-up, not 0 MiB: memory
// admission sums it. In a child process of its own (one runtime per process), with the
// generated tagger and max_batch 8 (warm-ups at batch 1 and 8).
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
	src := "[nats]\nurl = \"nats://127.0.0.1:1\"\n[pools.cpu]\nclasses = [\"batch\"]\nmax_batch = 8\nmodels = [\"tagger\"]\n" +
		"[models.tagger]\nkind = \"tagger-pixai\"\ndir = \"" + os.Getenv(reloadPeakDir) + "\"\n"
	c, err := config.Parse([]byte(src), "reload-peak.toml")
	if err != nil {
		t.Fatal(err)
	}
	p := c.Pools["cpu"]
	w := &Worker{cfg: c, pool: p, id: "cpu-peak", log: slog.New(slog.NewTextHandler(io.Discard, nil)), rt: rt,
		models: newModelSet(), start: time.Now(), open: models.Open, dev: newDevMem(p.Device),
		q: newQueues(p.Classes, p.QueueBound, p.MaxBatch, p.MaxDelay.D())}
	w.env = models.Env{Runtime: rt, Session: ort.PoolSessionConfig(p, false)}
	w.rssBase = rssBytes()
	if err := w.loadModels(w.env, w.open, 0); err != nil {
		t.Fatal(err)
	}
	first, _ := status(w, "tagger")
	if first.State != codec.ModelReady || first.PeakSource != "rss" || first.PeakBytes <= 0 {
		t.Fatalf("tagger at start-up: %+v, want ready with its RSS peak", first)
	}
	for i := range 3 {
		st, err := w.loadInPlace(c.Models["tagger"], 0, p.Models)
		if err != nil {
			t.Fatalf("reload %d: %v", i+1, err)
		}
		t.Logf("peak at start-up %s, reload %d: %s (%s)", mib(first.PeakBytes), i+1, mib(st.PeakBytes), st.PeakSource)
		// The runtime's own first-use costs (its environment, thread pools) are in the
		// start-up figure only: a reload's is lower, but never near nothing.
		if st.PeakSource != "rss" || st.PeakBytes < first.PeakBytes/4 {
			t.Errorf("reload %d: peak %s (%s), want measured by rss, at least a quarter of the %s at start-up", i+1, mib(st.PeakBytes), st.PeakSource, mib(first.PeakBytes))
		}
		if hb, _ := status(w, "tagger"); hb.PeakBytes != st.PeakBytes {
			t.Errorf("reload %d: heartbeat peak %s, answered %s", i+1, mib(hb.PeakBytes), mib(st.PeakBytes))
		}
	}
}
