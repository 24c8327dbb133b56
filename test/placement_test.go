package test

import (
	"encoding/json"
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

// TestWebGPUNodePlacement: where each model's nodes run, from ONNX Runtime's profiler,
// in the gateway's status (what `ortbus status -json` prints) as nodes_by_ep. On a
// webgpu pool (lavapipe in CI: its absence fails the test there) the tiny model's nodes
// are all on webgpu, and the CPU-only model (onnxgen.CPUOnlyGraph) has its Det on the
// cpu beside its Mul on webgpu; a strict pool (cpu_fallback = false) serves the tiny
// model and refuses the CPU-only one, model_unavailable naming Det.
func TestWebGPUNodePlacement(t *testing.T) {
	testenv.RequireVulkan(t)
	root := imageRoot(t)
	lib := testenv.RuntimeLib(t, "1.30.0")
	models := testenv.Models(t)
	cpuOnly := filepath.Join(t.TempDir(), "cpu-only")
	if err := os.Mkdir(cpuOnly, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := onnxgen.CPUOnlyGraph().WriteFile(filepath.Join(cpuOnly, onnxgen.ModelFile)); err != nil {
		t.Fatal(err)
	}
	// A model whose warm-up on zeros fails (Range's delta 0), so that no node runs at
	// load: its placement is not known, and a strict pool asks ONNX Runtime itself.
	noWarm := filepath.Join(t.TempDir(), "no-warm")
	ng := onnxgen.NewGraph("no_warm")
	ng.AddInput("x", onnxgen.Float, "N", 2, 2)
	ng.AddInput("d", onnxgen.Int64)
	ng.AddOutput("det", onnxgen.Float, "N")
	ng.AddOutputNoShape("r", onnxgen.Int64)
	ng.AddNode("Det", []string{"x"}, []string{"det"})
	ng.AddNode("Range", []string{ng.AddInt64("", nil, []int64{0}), ng.AddInt64("", nil, []int64{4}), "d"}, []string{"r"})
	if err := ng.WriteFile(filepath.Join(noWarm, onnxgen.ModelFile)); err != nil {
		t.Fatal(err)
	}
	strict := false
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"gpu", "strict"}}},
		Pools: map[string]*config.Pool{
			"gpu":    {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cpu", Env: testenv.WebGPUEnv(t), Classes: []string{"interactive"}, Models: []string{"tiny", "cpuonly", "nowarm"}},
			"strict": {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cpu", CPUFallback: &strict, Env: testenv.WebGPUEnv(t), Classes: []string{"interactive"}, Models: []string{"tiny", "cpuonly", "nowarm"}},
		},
		Models: map[string]*config.Model{
			"tiny":    {Kind: config.KindRaw, Dir: filepath.Join(models, onnxgen.TinyDir)},
			"cpuonly": {Kind: config.KindRaw, Dir: cpuOnly},
			"nowarm":  {Kind: config.KindRaw, Dir: noWarm},
		},
	}
	c.SetOrder("pools", "gpu", "strict")
	c.SetOrder("models", "tiny", "cpuonly", "nowarm")
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "placement.toml"), c))
	settled := func(st *codec.StatusReply) bool {
		n := 0
		for _, w := range st.Workers {
			if w.State != codec.StateReady {
				continue
			}
			for _, m := range w.Models {
				if m.State == codec.ModelReady || m.State == codec.ModelFailed {
					n++
				}
			}
		}
		return n == 6
	}
	st := g.waitStatus(t, "both pools' models loaded or failed", settled)
	models2 := map[string]codec.ModelStatus{}
	for _, w := range st.Workers {
		for _, m := range w.Models {
			models2[w.Pool+"/"+m.Name] = m
		}
	}
	for key, m := range models2 {
		t.Logf("%s: %s nodes_by_ep %v error %v", key, m.State, m.NodesByEP, m.Error)
	}
	if m := models2["gpu/tiny"]; m.State != codec.ModelReady || m.NodesByEP["webgpu"] == 0 || m.NodesByEP["cpu"] != 0 {
		t.Errorf("gpu/tiny: %s, nodes_by_ep %v: want every node on webgpu", m.State, m.NodesByEP)
	}
	if m := models2["gpu/cpuonly"]; m.State != codec.ModelReady || m.NodesByEP["webgpu"] == 0 || m.NodesByEP["cpu"] != 1 {
		t.Errorf("gpu/cpuonly: %s, nodes_by_ep %v: want Mul on webgpu, Det on cpu", m.State, m.NodesByEP)
	}
	if m := models2["strict/tiny"]; m.State != codec.ModelReady || m.NodesByEP["webgpu"] == 0 {
		t.Errorf("strict/tiny: %s, nodes_by_ep %v: a strict pool serves a model wholly on its EP", m.State, m.NodesByEP)
	}
	m := models2["strict/cpuonly"]
	if m.State != codec.ModelFailed || m.Error == nil || m.Error.Code != codec.CodeModelUnavailable ||
		!strings.Contains(m.Error.Message, onnxgen.CPUOnlyOp+" (cpu)") || !strings.Contains(m.Error.Message, "cpu_fallback = false") {
		t.Errorf("strict/cpuonly: %s, error %+v: want model_unavailable naming %s (cpu) and cpu_fallback = false", m.State, m.Error, onnxgen.CPUOnlyOp)
	}
	if m := models2["gpu/nowarm"]; m.State != codec.ModelReady || m.WarmupError == "" || len(m.NodesByEP) != 0 {
		t.Errorf("gpu/nowarm: %s, warm-up error %q, nodes_by_ep %v: want ready, its warm-up failed, no placement", m.State, m.WarmupError, m.NodesByEP)
	}
	m = models2["strict/nowarm"]
	if m.State != codec.ModelFailed || m.Error == nil || m.Error.Code != codec.CodeModelUnavailable ||
		!strings.Contains(m.Error.Message, "ops cannot be named") || !strings.Contains(m.Error.Message, "fallback to CPU EP has been explicitly disabled") {
		t.Errorf("strict/nowarm: %s, error %+v: want model_unavailable, ONNX Runtime's own refusal", m.State, m.Error)
	}
	// What ortbus status -json prints: the status reply as JSON.
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"nodes_by_ep":{"webgpu":`) {
		t.Errorf("status JSON has no nodes_by_ep with webgpu: %.2000s", b)
	}
}
