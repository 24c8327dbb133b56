package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// rssSMI is an nvidia-smi for a machine without one: a GPU "GPU-ortbus-fake" of index 0
// whose per-process memory is each ortworker's resident set (in MiB). lavapipe, the Vulkan
// driver the webgpu EP runs on here, keeps a GPU buffer in host memory, so what a webgpu
// worker puts on this "GPU" is what its resident set grows by. It answers the queries
// package devices makes: the index → uuid map, and the compute apps, listing the calling
// process when it is an ortworker (a worker reading its own figure) and the ortworker
// children of the caller (the gateway reading its device's processes), so that the
// workers of other tests running beside this one are never seen.
const rssSMI = `#!/bin/sh
case "$*" in
*--query-gpu=index,uuid*) echo "0, GPU-ortbus-fake" ;;
*--query-compute-apps=*)
	for p in $PPID $(pgrep -P $PPID -x ortworker); do
		[ "$(cat /proc/$p/comm 2>/dev/null)" = ortworker ] || continue
		r=$(awk '/^VmRSS:/ {print int($2/1024)}' /proc/$p/status 2>/dev/null)
		[ -n "$r" ] && echo "GPU-ortbus-fake, $p, $r"
	done ;;
*) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
`

// bigWeightsGraph is a model with a 64 MiB weight that every run reads: y = x·2 +
// mean(w·max(x)), x float [N,4] (the weight is scaled by the input, so that the runtime
// cannot fold it to a constant at load).
func bigWeightsGraph() *onnxgen.Graph {
	g := onnxgen.NewGraph("big_weights")
	g.AddInput("x", onnxgen.Float, "N", 4)
	g.AddOutput("y", onnxgen.Float, "N", 4)
	w := make([]float32, 16<<20)
	for i := range w {
		w[i] = float32(i%7) / 7
	}
	name := g.AddFloat("w", []int64{int64(len(w))}, w)
	scale := g.Op("ReduceMax", []string{"x"}, onnxgen.AttrInt("keepdims", 0))
	mean := g.Op("ReduceMean", []string{g.Op("Mul", []string{name, scale})}, onnxgen.AttrInt("keepdims", 0))
	g.AddNode("Add", []string{g.Op("Mul", []string{"x", g.Scalar(2)}), mean}, []string{"y"})
	return g
}

// TestWorkerDeviceMemoryAdmission: a webgpu worker on cuda:0 measures its model's peak on
// the device from its own process's figure (peak_source device: the growth from before
// the model's load to after its warm-up, here at least the 64 MiB weight) and reports its
// whole memory on the device in its heartbeat (device_bytes, from nvidia-smi); the gateway
// admits that figure on cuda:0, so a pool declaring what would pass the device's 85 %
// budget is refused, and so is a lease, each with the arithmetic in its message. The
// pools serve on lavapipe under cuda:0's name flagged (adapter_mismatch = "flag").
// nvidia-smi is rssSMI, first on the gateway's PATH; the worker, the runtime, the webgpu
// EP (on lavapipe) and the gateway are real.
func TestWorkerDeviceMemoryAdmission(t *testing.T) {
	testenv.OnlyLavapipe(t) // a GPU's adapter would not be lavapipe's figures

	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "nvidia-smi"), []byte(rssSMI), 0o755); err != nil {
		t.Fatal(err)
	}
	root := imageRoot(t)
	lib := testenv.RuntimeLib(t, "1.30.0")
	dir := filepath.Join(t.TempDir(), "big")
	if err := bigWeightsGraph().WriteFile(filepath.Join(dir, onnxgen.ModelFile)); err != nil {
		t.Fatal(err)
	}
	const capacity = 512 << 20 // budget 435.2 MiB
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Devices:  map[string]config.Device{"cuda:0": {Capacity: capacity, SafeFraction: 0.85}},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"gpu"}}, "batch": {Chain: []string{"late"}}},
		Pools: map[string]*config.Pool{
			// lavapipe stands in for the GPU of cuda:0: served flagged (adapter_mismatch).
			"gpu":  {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cuda:0", AdapterMismatch: config.AdapterFlag, Env: testenv.WebGPUEnv(t), Classes: []string{"interactive"}, Models: []string{"big"}},
			"late": {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cuda:0", AdapterMismatch: config.AdapterFlag, Env: testenv.WebGPUEnv(t), Classes: []string{"batch"}, Models: []string{"declared"}},
		},
		Models: map[string]*config.Model{
			"big":      {Kind: config.KindRaw, Dir: dir},
			"declared": {Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.TinyDir), Memory: 400 << 20},
		},
	}
	c.SetOrder("pools", "gpu", "late")
	g := launchGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gpumem.toml"), c), true, "PATH="+bin+":"+os.Getenv("PATH"))
	var w codec.WorkerStatus
	for _, w = range g.waitLive(t, "gpu", 1) {
	}
	if len(w.Models) != 1 || w.Models[0].State != codec.ModelReady {
		t.Fatalf("gpu worker's models: %+v", w.Models)
	}
	m := w.Models[0]
	if m.PeakSource != "device" || m.PeakBytes < 64<<20 {
		t.Fatalf("model big: peak %d bytes from %q, want at least its 64 MiB weight measured on the device", m.PeakBytes, m.PeakSource)
	}
	// The heartbeat's figure is sampled on its own: wait for one that has it.
	st := g.waitStatus(t, "the gpu worker's device memory in its heartbeat", func(st *codec.StatusReply) bool {
		for _, w := range gwLive(st, "gpu") {
			return w.DeviceSource == "nvidia-smi" && w.DeviceBytes >= m.PeakBytes
		}
		return false
	})
	w = gwLive(st, "gpu")[w.Worker]
	var dev codec.DeviceStatus
	for _, d := range st.Devices {
		if d.Device == "cuda:0" {
			dev = d
		}
	}
	if dev.AdmittedBytes < m.PeakBytes || dev.AdmittedBytes < w.DeviceBytes-(16<<20) {
		t.Errorf("cuda:0 admits %d bytes, want the worker's peak %d and about its measured %d", dev.AdmittedBytes, m.PeakBytes, w.DeviceBytes)
	}
	if dev.ForeignBytes != 0 {
		t.Errorf("cuda:0 counts %d foreign bytes: the worker's own memory was taken as a foreign process's", dev.ForeignBytes)
	}
	// The pool declaring 400 MiB does not fit beside it: refused, with the arithmetic.
	var late codec.PoolStatus
	for _, p := range g.status(t).Pools {
		if p.Name == "late" {
			late = p
		}
	}
	if late.Error == nil || late.Error.Code != codec.CodeOverloaded || late.Live != 0 {
		t.Fatalf("pool late (400 MiB declared beside a measured %d MiB, budget 435 MiB) was not refused: %+v", m.PeakBytes>>20, late)
	}
	for _, want := range []string{"device cuda:0", "435.2MiB", "400.0MiB"} {
		if !strings.Contains(late.Error.Message, want) {
			t.Errorf("refusal %q does not name %q", late.Error.Message, want)
		}
	}
	// So is a lease that would pass the budget with the worker's measured memory.
	ask := dev.BudgetBytes - dev.AdmittedBytes + (8 << 20)
	_, e := leaseReq(t, g, fmt.Sprintf(`{"action":"acquire","device":"cuda:0","bytes":%d,"class":"batch","ttl_ms":5000,"holder":"llm"}`, ask))
	if e == nil || e.Code != codec.CodeOverloaded || !strings.Contains(e.Message, "cuda:0") {
		t.Fatalf("a lease of %d bytes beside %d admitted on a %d budget: %v, want overloaded", ask, dev.AdmittedBytes, dev.BudgetBytes, e)
	}
	if sum, _ := e.Details["sum_bytes"].(float64); int64(sum) < dev.AdmittedBytes+ask {
		t.Errorf("lease refusal's sum %v does not count the worker's admitted %d and the ask %d: %v", e.Details["sum_bytes"], dev.AdmittedBytes, ask, e)
	}
}
