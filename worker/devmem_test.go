package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/ort"
)

// gpuModel is a model whose one session runs on ep, and whose warm-ups grow the fake
// device's figure by grow bytes each.
type gpuModel struct {
	qModel
	ep   string
	dev  *fakeDev
	grow int64
}

func (m *gpuModel) Sessions() []*ort.Session { return []*ort.Session{{EP: m.ep}} }
func (m *gpuModel) Warmup(context.Context, int) error {
	m.dev.bytes += m.grow
	return nil
}

// fakeDev is a device reader for one process: its figure, or an error.
type fakeDev struct {
	bytes int64
	err   error
	reads int
}

func (d *fakeDev) read(device string, pid int) (int64, bool, error) {
	d.reads++
	if d.err != nil {
		return 0, false, d.err
	}
	return d.bytes, true, nil
}

// TestMeasureDevicePeak: on a device with a per-process reader, a model that runs on a GPU
// EP has as its peak the growth of the process's own figure from before its load to after
// its warm-ups (source device), not its RSS; a model that fell back to the CPU EP, or a
// reader that fails, is measured by its RSS. The figure read last is the heartbeat's.
func TestMeasureDevicePeak(t *testing.T) {
	w := &loader{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p := &config.Pool{Name: "gpu", Device: "cuda:0", MaxBatch: 4}
	mc := &config.Model{Name: "a", Kind: "tagger-pixai"}

	dev := &fakeDev{bytes: 300 << 20} // the process's context and earlier models
	w.dev = &devMem{device: "cuda:0", pid: 1, read: dev.read}
	before, ok := w.dev.now()
	dev.bytes += 40 << 20 // the session's weights, uploaded at load
	m := &gpuModel{qModel: modelA, ep: "webgpu", dev: dev, grow: 5 << 20}
	st := w.measure(m, mc, p, 0, false, before, ok)
	if st.PeakSource != "device" || st.PeakBytes != 50<<20 {
		t.Errorf("webgpu model: peak %d MiB from %q, want 50 MiB (40 at load + 2 warm-ups of 5) from device", st.PeakBytes>>20, st.PeakSource)
	}
	if b, src := w.dev.last(); b != 350<<20 || src != "nvidia-smi" {
		t.Errorf("last sample %d MiB from %q, want 350 MiB from nvidia-smi", b>>20, src)
	}

	// The same model on the CPU EP (a fallback): its RSS, not the device.
	cpu := &gpuModel{qModel: modelA, ep: "cpu", dev: dev, grow: 5 << 20}
	before, ok = w.dev.now()
	if st := w.measure(cpu, mc, p, 0, false, before, ok); st.PeakSource != "rss" {
		t.Errorf("cpu-EP model on cuda:0: peak from %q, want rss", st.PeakSource)
	}
	// No reading before the load: not measured on the device.
	dev.err = errors.New("nvidia-smi: exit status 9")
	before, ok = w.dev.now()
	if ok {
		t.Fatal("a failing reader reported a figure")
	}
	if st := w.measure(m, mc, p, 0, false, before, ok); st.PeakSource != "rss" {
		t.Errorf("webgpu model without a device reading: peak from %q, want rss", st.PeakSource)
	}
	// A nil devMem (a worker without a device reader) measures nothing and never panics.
	var none *devMem
	if b, ok := none.now(); ok || b != 0 {
		t.Error("nil devMem measured something")
	}
	none.run(context.Background(), 0)
}

// TestDevMemRunStopsWithoutReader: on a device without a per-process reader (cpu), the
// sampler reads once and returns at once, leaving the heartbeat without a figure.
func TestDevMemRunStopsWithoutReader(t *testing.T) {
	d := &devMem{device: "cpu", pid: 1, read: func(string, int) (int64, bool, error) { return 0, false, nil }}
	d.run(context.Background(), 0) // returns: nothing to sample
	if b, src := d.last(); b != 0 || src != "" {
		t.Errorf("cpu device: last sample %d from %q, want none", b, src)
	}
}
