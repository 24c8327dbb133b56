package cli

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// TestPrintStatusModels: the pool table names the models that failed on a worker of the
// pool; the models table gives each worker's models with their state and reason, on one
// line each; a worker older than ModelStatus.State shows ready for a loaded model.
func TestPrintStatusModels(t *testing.T) {
	wk := func(id, pool string, models ...codec.ModelStatus) codec.WorkerStatus {
		return codec.WorkerStatus{Heartbeat: codec.Heartbeat{Worker: id, Pool: pool, State: codec.StateReady, Models: models}}
	}
	st := &codec.StatusReply{
		Gateway: "gw",
		Pools: []codec.PoolStatus{{Name: "cpu", Live: 2, Workers: 2, Skipped: map[string]string{"boom": "worker cpu-0 died while loading it (signal: segmentation fault)"}},
			{Name: "old", Live: 1, Workers: 1}, {Name: "new", Workers: 1, Loading: []string{"tagger"}, Unloaded: []string{"ccip"}}},
		Workers: []codec.WorkerStatus{
			wk("cpu-0", "cpu",
				codec.ModelStatus{Name: "tiny", State: codec.ModelReady, Loaded: true, LoadMS: 12, PeakBytes: 3 << 20, NodesByEP: map[string]int{"webgpu": 12, "cpu": 1}},
				codec.ModelStatus{Name: "bad", State: codec.ModelFailed, Error: codec.Errorf(codec.CodeModelUnavailable, "ONNX Runtime cannot load\tit:\nNoSuchOp")},
				codec.ModelStatus{Name: "vad", State: codec.ModelReady, Loaded: true, WarmupError: "Invalid input shape"}),
			wk("cpu-1", "cpu", codec.ModelStatus{Name: "bad", State: codec.ModelFailed, Error: codec.Errorf(codec.CodeInternal, "panic")}),
			wk("old-0", "old", codec.ModelStatus{Name: "tagger", Loaded: true}),
		},
	}
	var buf bytes.Buffer
	PrintStatus(&buf, st)
	out := buf.String()
	var lines []string
	for line := range strings.Lines(out) {
		lines = append(lines, strings.Join(strings.Fields(line), " "))
	}
	for _, want := range []string{
		"cpu false 2/2 ok; failed models: bad; skipped (a worker died loading them): boom",
		"new false 0/1 no live workers; loading: tagger; unloaded: ccip",
		"old false 1/1 ok",
		"tiny cpu cpu-0 ready 12ms 3MiB cpu:1,webgpu:12",
		"bad cpu cpu-0 failed 0s 0MiB - model_unavailable: ONNX Runtime cannot load it: NoSuchOp",
		"bad cpu cpu-1 failed 0s 0MiB - internal: panic",
		"vad cpu cpu-0 ready 0s 0MiB - warm-up failed (serves all the same): Invalid input shape",
		"tagger old old-0 ready 0s 0MiB -",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("no line %q in:\n%s", want, out)
		}
	}
}

// TestOneLineStripsControl: heartbeat text never carries a terminal escape to the
// operator's terminal.
func TestOneLineStripsControl(t *testing.T) {
	if got := oneLine("bad\x1b[2J model\x07\nload", 80); got != "bad [2J model load" {
		t.Fatalf("oneLine = %q", got)
	}
}

// TestPrintStatusDeviceMem: the workers table shows each worker's own memory on its
// device where the driver reports it, and "-" where the device has no per-process reader.
func TestPrintStatusDeviceMem(t *testing.T) {
	st := &codec.StatusReply{Workers: []codec.WorkerStatus{
		{Heartbeat: codec.Heartbeat{Worker: "gpu-0", Pool: "gpu", PID: 7, State: codec.StateReady, EP: "webgpu", Device: "cuda:0", DeviceBytes: 195 << 20, DeviceSource: "nvidia-smi"}},
		{Heartbeat: codec.Heartbeat{Worker: "cpu-0", Pool: "cpu", PID: 8, State: codec.StateReady, EP: "cpu", Device: "cpu"}},
	}}
	var buf bytes.Buffer
	PrintStatus(&buf, st)
	var lines []string
	for line := range strings.Lines(buf.String()) {
		lines = append(lines, strings.Join(strings.Fields(line), " "))
	}
	for _, prefix := range []string{"gpu-0 gpu 7 ready webgpu cuda:0 195MiB ", "cpu-0 cpu 8 ready cpu - "} {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) }) {
			t.Errorf("no line starting %q in:\n%s", prefix, buf.String())
		}
	}
}

// TestPrintStatusPauses: a pause in force is in the status tables (class, device, owner,
// end).
func TestPrintStatusPauses(t *testing.T) {
	until := time.Now().Add(10 * time.Minute)
	st := &codec.StatusReply{Pauses: []codec.PauseReply{{Class: "batch", UntilUnixMS: until.UnixMilli()}, {Class: "interactive", Device: "cuda:0", Owner: "account:APP1", UntilUnixMS: until.UnixMilli()}}}
	var buf bytes.Buffer
	PrintStatus(&buf, st)
	out := buf.String()
	for _, want := range []string{"PAUSED CLASS", "batch", "every device", "interactive", "cuda:0", "account:APP1", "operator", until.Format(time.TimeOnly)} {
		if !strings.Contains(out, want) {
			t.Errorf("status output has no %q:\n%s", want, out)
		}
	}
}
