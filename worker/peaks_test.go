package worker

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// TestPeakFloors: a model loaded three times from the same files is admitted at no less
// than the largest peak measured of it (its first load's, then a larger reload's), the
// kept figure saying so (rss-kept); once its file changes it is measured afresh, its peak
// replaced by the new measurement (rss), which is the floor from then on. A declared peak
// is neither raised nor kept; a device figure is no floor of an RSS one.
func TestPeakFloors(t *testing.T) {
	dir := t.TempDir()
	onnx := filepath.Join(dir, "model.onnx")
	if err := os.WriteFile(onnx, []byte("weights"), 0o600); err != nil {
		t.Fatal(err)
	}
	mc := &config.Model{Name: "tagger", Kind: "tagger-pixai", Dir: dir}
	ready := func(peak int64, source string) codec.ModelStatus {
		return codec.ModelStatus{Name: "tagger", Kind: mc.Kind, State: codec.ModelReady, Loaded: true, PeakBytes: peak, PeakSource: source}
	}
	f := newPeakFloors()
	rev := fileRev(mc)
	if rev != fileRev(mc) {
		t.Fatal("fileRev differs for the same files")
	}
	steps := []struct {
		what     string
		measured int64
		want     int64
		source   string
	}{
		{"first load", 13 << 20, 13 << 20, "rss"},
		{"reload 1 (grew past it)", 19 << 20, 19 << 20, "rss"},
		{"reload 2 (pages reused)", 1 << 19, 19 << 20, "rss-kept"},
		{"reload 3 (pages reused)", 1 << 19, 19 << 20, "rss-kept"},
	}
	for _, s := range steps {
		st := f.admit(rev, ready(s.measured, "rss"))
		if st.PeakBytes != s.want || st.PeakSource != s.source {
			t.Errorf("%s: measured %s, admitted %s (%s), want %s (%s)", s.what, mib(s.measured), mib(st.PeakBytes), st.PeakSource, mib(s.want), s.source)
		}
		if st.PeakBytes < 13<<20 {
			t.Errorf("%s: admitted %s, below the %s measured at its first load", s.what, mib(st.PeakBytes), mib(13<<20))
		}
	}

	// Its file changes: another revision, measured afresh.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(onnx, later, later); err != nil {
		t.Fatal(err)
	}
	changed := fileRev(mc)
	if changed == rev {
		t.Fatal("fileRev is the same after the model's file changed")
	}
	if st := f.admit(changed, ready(6<<20, "rss")); st.PeakBytes != 6<<20 || st.PeakSource != "rss" {
		t.Errorf("changed file: admitted %s (%s), want its new measurement, 6.0MiB (rss)", mib(st.PeakBytes), st.PeakSource)
	}
	if st := f.admit(changed, ready(1<<20, "rss")); st.PeakBytes != 6<<20 || st.PeakSource != "rss-kept" {
		t.Errorf("changed file reloaded: admitted %s (%s), want the new floor, 6.0MiB (rss-kept)", mib(st.PeakBytes), st.PeakSource)
	}

	// A declared peak is the operator's: as declared, and it keeps no floor.
	if st := f.admit(changed, ready(1<<20, "declared")); st.PeakBytes != 1<<20 || st.PeakSource != "declared" {
		t.Errorf("declared: admitted %s (%s), want 1.0MiB (declared)", mib(st.PeakBytes), st.PeakSource)
	}
	// Measured on the device: no RSS floor applies, and it keeps its own.
	if st := f.admit(changed, ready(2<<20, "device")); st.PeakBytes != 2<<20 || st.PeakSource != "device" {
		t.Errorf("device: admitted %s (%s), want 2.0MiB (device)", mib(st.PeakBytes), st.PeakSource)
	}
	if st := f.admit(changed, ready(1<<20, "device")); st.PeakBytes != 2<<20 || st.PeakSource != "device-kept" {
		t.Errorf("device reloaded: admitted %s (%s), want 2.0MiB (device-kept)", mib(st.PeakBytes), st.PeakSource)
	}
	// A failed model is not measured.
	failed := codec.ModelStatus{Name: "other", State: codec.ModelFailed, PeakBytes: 9 << 20, PeakSource: "rss"}
	f.admit(rev, failed)
	if st := f.admit(rev, codec.ModelStatus{Name: "other", State: codec.ModelReady, PeakBytes: 1 << 20, PeakSource: "rss"}); st.PeakBytes != 1<<20 {
		t.Errorf("a failed load kept a floor: admitted %s", mib(st.PeakBytes))
	}
}
