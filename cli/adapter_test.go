package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// TestPrintStatusAdapterMismatch: a pool whose worker serves on an adapter that is not its
// device's GPU (flagged) says so in its state, naming why; a device of unknown capacity
// says that it admits nothing, and why.
func TestPrintStatusAdapterMismatch(t *testing.T) {
	why := "the Vulkan adapter Mesa llvmpipe is a cpu device, not a GPU (device cuda:0)"
	st := &codec.StatusReply{
		Pools: []codec.PoolStatus{{Name: "gpu", EP: "webgpu", Device: "cuda:0", Workers: 1, Live: 1}, {Name: "cpu", EP: "cpu", Device: "cpu", Workers: 1, Live: 1}},
		Workers: []codec.WorkerStatus{
			{Heartbeat: codec.Heartbeat{Worker: "gpu-0", Pool: "gpu", State: codec.StateReady, EP: "webgpu", Device: "cuda:0", Adapter: "Mesa llvmpipe", AdapterMismatch: why}},
			{Heartbeat: codec.Heartbeat{Worker: "cpu-0", Pool: "cpu", State: codec.StateReady, EP: "cpu", Device: "cpu"}},
		},
		Devices: []codec.DeviceStatus{{Device: "gpu.intel:3", CapacityError: "device gpu.intel:3: no reader for its memory"}, {Device: "cpu", CapacityBytes: 1 << 30}},
	}
	var buf bytes.Buffer
	PrintStatus(&buf, st)
	out := buf.String()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "gpu":
			if !strings.Contains(line, "ADAPTER MISMATCH (flagged") || !strings.Contains(line, "not a GPU (device cuda:0)") {
				t.Errorf("the flagged pool's line: %q", line)
			}
		case "cpu":
			if strings.Contains(line, "MISMATCH") {
				t.Errorf("the cpu pool's line: %q", line)
			}
		case "gpu.intel:3":
			if !strings.Contains(line, "unknown, admits nothing (device gpu.intel:3: no reader") {
				t.Errorf("the device of unknown capacity: %q", line)
			}
		}
	}
	if !strings.Contains(out, "1024MiB") {
		t.Errorf("a known capacity is not shown:\n%s", out)
	}
}
