package worker

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// TestDeviceLost: the run errors of a lost GPU device are told from the others.
func TestDeviceLost(t *testing.T) {
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{errors.New("[WebGPU] Device lost: the GPU was reset"), true},
		{errors.New("DeviceLost"), true},
		{errors.New("vkQueueSubmit: VK_ERROR_DEVICE_LOST"), true},
		{errors.New("the device was lost (reason: destroyed)"), true},
		{errors.New("Got invalid dimensions for input: x"), false},
		{errors.New("out of memory"), false},
		{nil, false},
	} {
		if got := deviceLost(c.err); got != c.lost {
			t.Errorf("deviceLost(%v) = %v", c.err, got)
		}
	}
}

// TestAdapterLost: on webgpu, a run error of a lost device is answered
// provider_unavailable naming the adapter, and fails every model of the set (once):
// listed failed with that error, their copies closed, a request for one answered
// model_unavailable with it; any other run error, or a lost device's text on another EP,
// passes as it is.
func TestAdapterLost(t *testing.T) {
	ms := newModelSet("gpu", "gpu-0")
	a, b := &fakeRaw{name: "a"}, &fakeRaw{name: "b"}
	for _, m := range []*fakeRaw{a, b} {
		ms.serve(m, codec.ModelStatus{Name: m.name, Kind: m.Kind(), State: codec.ModelReady, PeakBytes: 1 << 20}, nil)
	}
	w := &adapterWatch{models: ms, adapter: func() string { return "NVIDIA H200" }, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	plain := errors.New("Got invalid dimensions for input: x")
	if err := w.check("webgpu", plain); err != plain {
		t.Errorf("another run error: %v", err)
	}
	if err := w.check("cpu", errors.New("device lost")); codec.AsError(err).Code == codec.CodeProviderUnavailable {
		t.Errorf("a cpu run's error taken for a lost adapter: %v", err)
	}
	for _, st := range ms.statuses() {
		if st.State != codec.ModelReady {
			t.Fatalf("model %s %s before any loss", st.Name, st.State)
		}
	}
	e := codec.AsError(w.check("webgpu", errors.New("Dawn: Device lost (VK_ERROR_DEVICE_LOST)")))
	if e.Code != codec.CodeProviderUnavailable || !strings.Contains(e.Message, "adapter was lost while running: Dawn: Device lost") || !strings.Contains(e.Message, "(adapter NVIDIA H200)") || e.Details["ep"] != "webgpu" || e.Details["adapter"] != "NVIDIA H200" {
		t.Fatalf("the lost run's answer: %+v", e)
	}
	for _, st := range ms.statuses() {
		if st.State != codec.ModelFailed || st.Error == nil || st.Error.Code != codec.CodeProviderUnavailable {
			t.Errorf("model %s after the loss: %+v", st.Name, st)
		}
	}
	if !a.closed || !b.closed {
		t.Error("the lost models' copies are not closed")
	}
	if _, _, err := ms.acquire("a", ""); err == nil || codec.AsError(err).Code != codec.CodeModelUnavailable || !strings.Contains(codec.AsError(err).Message, "lost") {
		t.Errorf("a request for a lost model: %v", err)
	}
	if again := codec.AsError(w.check("webgpu", errors.New("device lost"))); again.Code != codec.CodeProviderUnavailable {
		t.Errorf("a second lost run: %+v", again)
	}
}
