package test

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// The webgpu EP for real: ONNX Runtime 1.30.0's WebGPU EP (Dawn over Vulkan) on whatever
// adapter the machine has — in CI, lavapipe (Mesa's Vulkan on the CPU, installed by
// scripts/install-vulkan.sh), on a GPU machine its GPU. The pools, workers, gateway and
// NATS are the real ones.

// webgpuTol is the ONNX backend tests' tolerance for float32 results, loosened by an
// order for a GPU's reordered sums: |got − want| ≤ atol + rtol·|want|.
const webgpuRTol, webgpuATol = 1e-3, 1e-5

// TestWebGPUPoolMatchesCPU: a webgpu pool serves the generated tagger (ReduceMean, Mul,
// Concat, MatMul, Add, Sigmoid on a [1,3,448,448] input) and the tiny model through the
// gateway, its worker and its replies saying webgpu, and its outputs equal the CPU pool's
// for the same inputs within the ONNX backend tolerance. A chain webgpu → cpu whose
// worker finds no adapter (an empty Vulkan driver list) falls back to cpu and serves the
// same outputs; a strict webgpu pool without an adapter fails as a pool
// (provider_unavailable, naming the missing adapter), and so are its requests answered.
func TestWebGPUPoolMatchesCPU(t *testing.T) {
	testenv.RequireVulkan(t)
	root := imageRoot(t)
	lib := testenv.RuntimeLib(t, "1.30.0")
	models := testenv.Models(t)
	noAdapter := testenv.WebGPUEnv(t)
	noAdapter["VK_DRIVER_FILES"] = filepath.Join(t.TempDir(), "no-driver.json")
	noAdapter["VK_ICD_FILENAMES"] = noAdapter["VK_DRIVER_FILES"]
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: config.Duration(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: config.Duration(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"gpu", "cpu", "chain", "strict"}}},
		Pools: map[string]*config.Pool{
			"gpu":    {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cpu", Env: testenv.WebGPUEnv(t), Classes: []string{"interactive"}, Models: []string{"tagger", "tiny"}},
			"cpu":    {Runtime: lib, Threads: 1, Classes: []string{"interactive"}, Models: []string{"tagger", "tiny"}},
			"chain":  {Runtime: lib, Threads: 1, EP: "webgpu", Fallback: []string{"cpu"}, Device: "cpu", Env: noAdapter, Classes: []string{"interactive"}, Models: []string{"tagger", "tiny"}},
			"strict": {Runtime: lib, Threads: 1, EP: "webgpu", Device: "cpu", Env: noAdapter, Classes: []string{"interactive"}, Models: []string{"tiny"}},
		},
		Models: map[string]*config.Model{
			"tagger": {Kind: config.KindRaw, Dir: filepath.Join(models, onnxgen.TaggerDir)},
			"tiny":   {Kind: config.KindRaw, Dir: filepath.Join(models, onnxgen.TinyDir)},
		},
	}
	c.SetOrder("pools", "gpu", "cpu", "chain", "strict")
	c.SetOrder("models", "tagger", "tiny")
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "webgpu.toml"), c))
	for pool, ep := range map[string]string{"gpu": "webgpu", "cpu": "cpu", "chain": "cpu"} {
		for _, w := range g.waitLive(t, pool, 1) {
			if w.EP != ep {
				t.Errorf("pool %s: worker %s runs ep %q, want %q", pool, w.Worker, w.EP, ep)
			}
			if pool == "gpu" {
				for _, m := range w.Models {
					if m.State != codec.ModelReady {
						t.Errorf("webgpu pool: model %s is %s: %+v", m.Name, m.State, m.Error)
					}
				}
			}
		}
	}

	rng := rand.New(rand.NewPCG(31, 1))
	image := make([]float32, 3*onnxgen.TaggerSize*onnxgen.TaggerSize)
	for i := range image {
		image[i] = rng.Float32()
	}
	tiny := []float32{0, 1, -2.5, 3.25, 1e-3, 100, -7, 0.5}
	cases := []struct {
		model string
		x     *codec.Tensor
		input string
	}{
		{"tagger", &codec.Tensor{Type: "float32", Shape: []int64{1, 3, onnxgen.TaggerSize, onnxgen.TaggerSize}, Data: codec.Float32Bytes(image)}, "input"},
		{"tiny", &codec.Tensor{Type: "float32", Shape: []int64{2, 4}, Data: codec.Float32Bytes(tiny)}, "x"},
	}
	for _, cs := range cases {
		// By path, as clients send images: the tagger's input is 2.4 MB, over NATS's
		// payload limit.
		in := filepath.Join(root, cs.model+".npy")
		writeNPY(t, in, cs.x)
		req := func(pool string) *codec.Request {
			return &codec.Request{Model: cs.model, Pool: pool, Class: "interactive", InputPaths: map[string]string{cs.input: in}}
		}
		want, err := g.infer(t, req("cpu"))
		if err != nil {
			t.Fatalf("%s on the cpu pool: %v", cs.model, err)
		}
		for _, pool := range []string{"gpu", "chain"} {
			got, err := g.infer(t, req(pool))
			if err != nil {
				t.Errorf("%s on pool %s: %v", cs.model, pool, err)
				continue
			}
			wantEP := map[string]string{"gpu": "webgpu", "chain": "cpu"}[pool]
			if got.Pool != pool || got.EP != wantEP {
				t.Errorf("%s on pool %s: served by pool %q ep %q, want ep %q", cs.model, pool, got.Pool, got.EP, wantEP)
			}
			webgpuClose(t, cs.model+" on "+pool, got.Outputs, want.Outputs)
		}
	}

	// The strict pool: no adapter, no fallback. ONNX Runtime's WebGPU EP asks Dawn for
	// its adapter when it is appended, so the whole chain is unusable: the pool's failure
	// (its worker exits 3, not restarted), provider_unavailable naming the adapter, and
	// its requests are answered with it.
	st := g.waitStatus(t, "pool strict failed", func(st *codec.StatusReply) bool {
		for _, p := range st.Pools {
			if p.Name == "strict" && p.Error != nil {
				return true
			}
		}
		return false
	})
	for _, p := range st.Pools {
		if p.Name == "strict" && (p.Error.Code != codec.CodeProviderUnavailable || !strings.Contains(p.Error.Message, "adapter") || p.Live != 0) {
			t.Errorf("strict webgpu pool without an adapter: %+v, want provider_unavailable naming the adapter", p)
		}
	}
	_, e := g.infer(t, &codec.Request{Model: "tiny", Pool: "strict", Class: "interactive", Inputs: map[string]*codec.Tensor{"x": cases[1].x}})
	if e == nil || e.Code != codec.CodeProviderUnavailable {
		t.Errorf("a request to the strict pool answered %+v, want provider_unavailable", e)
	}
}

// webgpuClose fails t unless got has want's outputs, of the same types and shapes, each
// float32 element within the tolerance (webgpuRTol, webgpuATol).
func webgpuClose(t *testing.T, what string, got, want map[string]*codec.Tensor) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d outputs, want %d", what, len(got), len(want))
	}
	for name, w := range want {
		g := got[name]
		if g == nil || g.Type != w.Type || len(g.Shape) != len(w.Shape) || w.Type != "float32" {
			t.Fatalf("%s: output %s = %s, want %s", what, name, describeTensor(g), describeTensor(w))
		}
		for i := range w.Shape {
			if g.Shape[i] != w.Shape[i] {
				t.Fatalf("%s: output %s shape %v, want %v", what, name, g.Shape, w.Shape)
			}
		}
		gv, err1 := codec.BytesFloat32(g.Data)
		wv, err2 := codec.BytesFloat32(w.Data)
		if err1 != nil || err2 != nil || len(gv) != len(wv) || len(wv) == 0 {
			t.Fatalf("%s: output %s: %d and %d values (%v %v)", what, name, len(gv), len(wv), err1, err2)
		}
		bad := 0
		for i := range wv {
			if d := math.Abs(float64(gv[i] - wv[i])); d > webgpuATol+webgpuRTol*math.Abs(float64(wv[i])) || math.IsNaN(float64(gv[i])) {
				if bad++; bad <= 3 {
					t.Errorf("%s: output %s[%d] = %g, want %g (tolerance %g + %g·|want|)", what, name, i, gv[i], wv[i], webgpuATol, webgpuRTol)
				}
			}
		}
		if bad > 0 {
			t.Errorf("%s: output %s: %d of %d values out of tolerance", what, name, bad, len(wv))
		}
	}
}
