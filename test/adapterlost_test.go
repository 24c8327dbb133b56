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
	"github.com/ortbus/ortbus/internal/fault"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestWebGPUAdapterLost: a webgpu worker (real, on lavapipe) whose adapter is lost while
// it serves — caused by the fault hook (ORTBUS_FAULT_INJECT=1 in its pool's env, a request
// path naming fault.MagicAdapterLost: the run fails as a lost device's does; a real GPU
// reset cannot be caused on lavapipe) — answers that request provider_unavailable, naming
// the adapter; its model then fails (status says why: provider_unavailable, the adapter
// lost), and the class's chain goes on to the cpu pool, which serves the next request.
func TestWebGPUAdapterLost(t *testing.T) {
	t.Parallel()
	testenv.RequireVulkan(t)
	root := imageRoot(t)
	lib := testenv.RuntimeLib(t, "1.30.0")
	env := testenv.WebGPUEnv(t)
	env[fault.EnvVar] = "1"
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"gpu", "cpu"}}},
		Pools: map[string]*config.Pool{
			"gpu": {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cpu", Env: env, Classes: []string{"interactive"}, Models: []string{"tiny"}},
			"cpu": {Runtime: lib, Threads: 1, Classes: []string{"interactive"}, Models: []string{"tiny"}},
		},
		Models: map[string]*config.Model{"tiny": {Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.TinyDir)}},
	}
	c.SetOrder("pools", "gpu", "cpu")
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "lost.toml"), c))
	g.waitLive(t, "gpu", 1)
	g.waitLive(t, "cpu", 1)
	x := &codec.Tensor{Type: "float32", Shape: []int64{1, onnxgen.TinyDim}, Data: codec.Float32Bytes(make([]float32, onnxgen.TinyDim))}
	req := func() *codec.Request {
		return &codec.Request{Model: "tiny", Class: "interactive", Inputs: map[string]*codec.Tensor{"x": x}}
	}
	if r, e := g.infer(t, req()); e != nil || r.Pool != "gpu" || r.EP != "webgpu" {
		t.Fatalf("before the loss: %+v %v, want served by the gpu pool on webgpu", r, e)
	}
	lost := filepath.Join(root, fault.MagicAdapterLost+".npy")
	writeNPY(t, lost, x)
	_, e := g.infer(t, &codec.Request{Model: "tiny", Pool: "gpu", Class: "interactive", InputPaths: map[string]string{"x": lost}})
	if e == nil || e.Code != codec.CodeProviderUnavailable || !strings.Contains(e.Message, "llvmpipe") || !strings.Contains(e.Message, "was lost") {
		t.Fatalf("the run on the lost adapter: %v, want provider_unavailable naming the adapter", e)
	}
	st := g.waitStatus(t, "the gpu worker's model failed", func(st *codec.StatusReply) bool {
		for _, w := range gwLive(st, "gpu") {
			return len(w.Models) == 1 && w.Models[0].State == codec.ModelFailed
		}
		return false
	})
	for _, w := range gwLive(st, "gpu") {
		if me := w.Models[0].Error; me == nil || me.Code != codec.CodeProviderUnavailable || !strings.Contains(me.Message, "lost") {
			t.Errorf("the failed model's reason: %+v", me)
		}
	}
	var table bytes.Buffer
	cli.PrintStatus(&table, st)
	if !strings.Contains(table.String(), "failed models: tiny") || !strings.Contains(table.String(), "provider_unavailable: the webgpu adapter was lost while running") {
		t.Errorf("the status table does not say why:\n%s", table.String())
	}
	if r, e := g.infer(t, req()); e != nil || r.Pool != "cpu" {
		t.Errorf("after the loss: %+v %v, want served by the cpu pool, next in the chain", r, e)
	}
}
