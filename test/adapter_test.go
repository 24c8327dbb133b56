package test

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/cli"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestWebGPUPoolNotOnItsDevice: on lavapipe alone (VK_DRIVER_FILES naming its driver), a
// webgpu pool naming cuda:0 is never silently served on llvmpipe. By default its worker
// refuses to start: the pool fails, provider_unavailable naming llvmpipe and cuda:0, and
// its class's chain goes on to the next pool. With adapter_mismatch = "flag" its worker
// serves on webgpu, and its heartbeat, status -json and the status table say it is not on
// the GPU. A pool on a device with no capacity reading (gpu.intel:3, none declared) admits
// nothing: refused (overloaded), its device's status saying why. The gateway, the workers,
// the runtime and the webgpu EP are real.
func TestWebGPUPoolNotOnItsDevice(t *testing.T) {
	testenv.OnlyLavapipe(t) // the gateway and its workers inherit VK_DRIVER_FILES
	root := imageRoot(t)
	lib := testenv.RuntimeLib(t, "1.30.0")
	tiny := []string{"tiny"}
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Devices:  map[string]config.Device{"cuda:0": {Capacity: 1 << 30, SafeFraction: 0.85}},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"refused", "cpu"}}, "batch": {Chain: []string{"flagged", "nocap"}}},
		Pools: map[string]*config.Pool{
			"refused": {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cuda:0", Env: testenv.WebGPUEnv(t), Classes: []string{"interactive"}, Models: tiny},
			"flagged": {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cuda:0", AdapterMismatch: config.AdapterFlag, Env: testenv.WebGPUEnv(t), Classes: []string{"batch"}, Models: tiny},
			"cpu":     {Runtime: lib, Threads: 1, Classes: []string{"interactive"}, Models: tiny},
			"nocap":   {Runtime: lib, Threads: 1, Device: "gpu.intel:3", Classes: []string{"batch"}, Models: tiny},
		},
		Models: map[string]*config.Model{"tiny": {Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.TinyDir)}},
	}
	c.SetOrder("pools", "refused", "flagged", "cpu", "nocap")
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "adapter.toml"), c))
	g.waitLive(t, "cpu", 1)
	var flagged codec.WorkerStatus
	for _, flagged = range g.waitLive(t, "flagged", 1) {
	}
	if flagged.EP != "webgpu" || !strings.Contains(flagged.Adapter, "llvmpipe") || !strings.Contains(flagged.AdapterMismatch, "not a GPU (device cuda:0)") {
		t.Errorf("the flagged pool's worker: ep %q, adapter %q, mismatch %q", flagged.EP, flagged.Adapter, flagged.AdapterMismatch)
	}
	st := g.waitStatus(t, "pools refused and nocap failed", func(st *codec.StatusReply) bool {
		n := 0
		for _, p := range st.Pools {
			if (p.Name == "refused" || p.Name == "nocap") && p.Error != nil {
				n++
			}
		}
		return n == 2
	})
	for _, p := range st.Pools {
		switch {
		case p.Name == "refused" && (p.Error.Code != codec.CodeProviderUnavailable || p.Live != 0 ||
			!strings.Contains(p.Error.Message, "llvmpipe") || !strings.Contains(p.Error.Message, "cuda:0")):
			t.Errorf("webgpu pool on cuda:0 served by llvmpipe: %+v, want provider_unavailable naming both", p)
		case p.Name == "nocap" && (p.Error.Code != codec.CodeOverloaded || p.Live != 0 || !strings.Contains(p.Error.Message, "no capacity reading")):
			t.Errorf("pool on a device with no capacity reading: %+v, want refused", p)
		}
	}
	for _, d := range st.Devices {
		if d.Device == "gpu.intel:3" && (d.CapacityError == "" || d.AdmittedBytes != 0) {
			t.Errorf("device gpu.intel:3 in status: %+v, want why its capacity is unknown", d)
		}
	}
	var table bytes.Buffer
	cli.PrintStatus(&table, st)
	if !strings.Contains(table.String(), "ADAPTER MISMATCH (flagged") || !strings.Contains(table.String(), "unknown, admits nothing") {
		t.Errorf("the status table does not flag the pool and the device:\n%s", table.String())
	}

	x := &codec.Tensor{Type: "float32", Shape: []int64{1, onnxgen.TinyDim}, Data: codec.Float32Bytes(make([]float32, onnxgen.TinyDim))}
	// The class whose first pool refused its adapter is served by the next pool of its chain.
	if r, e := g.infer(t, &codec.Request{Model: "tiny", Class: "interactive", Inputs: map[string]*codec.Tensor{"x": x}}); e != nil || r.Pool != "cpu" {
		t.Errorf("interactive request: pool %v, %v; want the cpu pool after the refused one", r, e)
	}
	if r, e := g.infer(t, &codec.Request{Model: "tiny", Pool: "flagged", Class: "batch", Inputs: map[string]*codec.Tensor{"x": x}}); e != nil || r.EP != "webgpu" {
		t.Errorf("request to the flagged pool: %v, %v; want served on webgpu", r, e)
	}
}
