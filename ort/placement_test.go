package ort_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

// TestPlacement: ONNX Runtime's own report of where nodes ran (its profiler, through
// Session.Placement) on the WebGPU EP: the tiny model's nodes all on webgpu; the
// CPU-only model's Det on the CPU (the EP has no kernel for it) beside its Mul on
// webgpu; a session made without Placement has none; a second call has none. Runs in a
// child (one runtime per process) on whatever Vulkan adapter there is (lavapipe in CI).
func TestPlacement(t *testing.T) {
	const child = "TestPlacement"
	if !testenv.InChild(child) {
		testenv.RequireVulkan(t)
		lib := testenv.RuntimeLib(t, "1.30.0")
		testenv.RunChild(t, child, "ORTBUS_TEST_PLACEMENT_LIB="+lib, "XDG_RUNTIME_DIR="+testenv.WebGPUEnv(t)["XDG_RUNTIME_DIR"])
		return
	}
	rt, err := ort.Load(os.Getenv("ORTBUS_TEST_PLACEMENT_LIB"))
	if err != nil {
		t.Fatal(err)
	}
	cpuOnly := filepath.Join(t.TempDir(), "cpu-only.onnx")
	if err := onnxgen.CPUOnlyGraph().WriteFile(cpuOnly); err != nil {
		t.Fatal(err)
	}
	webgpu := ort.SessionConfig{Providers: []ort.Provider{{Name: "webgpu"}}, Placement: true}
	run := func(path string, cfg ort.SessionConfig, in ort.Tensor) *ort.Session {
		t.Helper()
		s, err := rt.NewSession(path, cfg)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		t.Cleanup(func() { s.Close() })
		if _, err := s.Run(context.Background(), []ort.Tensor{in}); err != nil {
			t.Fatalf("%s: run: %v", path, err)
		}
		return s
	}
	tiny := run(filepath.Join(testenv.Models(t), onnxgen.TinyDir, onnxgen.ModelFile), webgpu, ort.Tensor{Name: "x", Shape: []int64{1, onnxgen.TinyDim}, Data: make([]float32, onnxgen.TinyDim)})
	p, err := tiny.Placement()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tiny: %+v", p)
	if p.NodesByEP["webgpu"] == 0 || p.NodesByEP["cpu"] != 0 || len(p.Off("webgpu")) != 0 {
		t.Errorf("tiny on webgpu: %+v, want every node on webgpu", p)
	}
	if _, err := tiny.Placement(); err == nil {
		t.Error("a second Placement gave one")
	}
	co := run(cpuOnly, webgpu, ort.Tensor{Name: "x", Shape: []int64{1, 2, 2}, Data: []float32{1, 2, 3, 4}})
	p, err = co.Placement()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cpu-only: %+v", p)
	if p.NodesByEP["cpu"] != 1 || p.NodesByEP["webgpu"] == 0 || !slices.Equal(p.Off("webgpu"), []string{onnxgen.CPUOnlyOp + " (cpu)"}) {
		t.Errorf("cpu-only on webgpu: %+v (off webgpu %v), want %s alone on the cpu", p, p.Off("webgpu"), onnxgen.CPUOnlyOp)
	}
	plain := run(cpuOnly, ort.SessionConfig{Providers: []ort.Provider{{Name: "webgpu"}}}, ort.Tensor{Name: "x", Shape: []int64{1, 2, 2}, Data: []float32{1, 2, 3, 4}})
	if _, err := plain.Placement(); err == nil {
		t.Error("a session made without Placement gave one")
	}
	// ONNX Runtime's own strict check (no run needed, no node named).
	if err := rt.CheckNoCPUFallback(filepath.Join(testenv.Models(t), onnxgen.TinyDir, onnxgen.ModelFile), ort.Provider{Name: "webgpu"}); err != nil {
		t.Errorf("tiny, strict on webgpu: %v", err)
	}
	if err := rt.CheckNoCPUFallback(cpuOnly, ort.Provider{Name: "webgpu"}); err == nil {
		t.Error("the CPU-only model passed ONNX Runtime's strict check on webgpu")
	} else {
		t.Logf("cpu-only, strict on webgpu: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("ortbus-placement-%d-*", os.Getpid())))
	if len(left) != 0 {
		t.Errorf("profile files left behind: %v", left)
	}
}
