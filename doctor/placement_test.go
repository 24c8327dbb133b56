package doctor_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/doctor"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestDoctorModelsPlacement: doctor -models loads each pool's models on its EP and
// reports where their nodes ran (ONNX Runtime's profiler): on lavapipe, the tiny model
// wholly on webgpu, the CPU-only model's Det on the cpu; a strict pool (cpu_fallback =
// false) with the CPU-only model is not ok, the listing naming Det; a cpu pool's nodes
// are all on cpu.
func TestDoctorModelsPlacement(t *testing.T) {
	testenv.RequireVulkan(t)
	lib := testenv.RuntimeLib(t, "1.30.0")
	xdg := t.TempDir()
	if err := os.Chmod(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := onnxgen.CPUOnlyGraph().WriteFile(filepath.Join(dir, "cpu-only", onnxgen.ModelFile)); err != nil {
		t.Fatal(err)
	}
	tiny := filepath.Join(testenv.Models(t), onnxgen.TinyDir)
	env := fmt.Sprintf("env = { XDG_RUNTIME_DIR = %q }", xdg)
	pools := ""
	for _, p := range []struct{ name, lines string }{
		{"gpu", "ep = \"webgpu\"\ndevice = \"cpu\"\n" + env},
		{"strict", "ep = \"webgpu\"\ndevice = \"cpu\"\ncpu_fallback = false\n" + env},
		{"plain", ""},
	} {
		pools += fmt.Sprintf("[pools.%s]\nruntime = %q\nclasses = [\"interactive\"]\nmodels = [\"tiny\", \"cpuonly\"]\n%s\n", p.name, lib, p.lines)
	}
	path := filepath.Join(dir, "ortbus.toml")
	text := fmt.Sprintf("[nats]\nurl = \"nats://127.0.0.1:1\"\n[models.tiny]\nkind = \"raw\"\ndir = %q\n[models.cpuonly]\nkind = \"raw\"\ndir = %q\n%s", tiny, filepath.Join(dir, "cpu-only"), pools)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config: %v\n%s", err, text)
	}
	t.Setenv(probeChildEnv, "1")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	reports := doctor.Run(cfg, self, []string{"-config", path, "-models"}, 90*time.Second)
	var out bytes.Buffer
	doctor.Print(&out, reports)
	t.Logf("doctor -models:\n%s", out.String())
	by := map[string]*doctor.Report{}
	for _, r := range reports {
		by[r.Pool] = r
	}
	placement := func(pool, model string) *doctor.Placement {
		t.Helper()
		r := by[pool]
		if r == nil || r.Placements[model] == nil {
			t.Fatalf("pool %s: no placement of %s: %+v", pool, model, r)
		}
		return r.Placements[model]
	}
	if p := placement("gpu", "tiny"); p.EP != "webgpu" || p.NodesByEP["webgpu"] == 0 || len(p.OffEP) != 0 {
		t.Errorf("gpu/tiny: %+v", p)
	}
	if p := placement("gpu", "cpuonly"); p.NodesByEP["cpu"] != 1 || len(p.OffEP) != 1 || p.OffEP[0] != onnxgen.CPUOnlyOp+" (cpu)" {
		t.Errorf("gpu/cpuonly: %+v", p)
	}
	if !by["gpu"].OK() {
		t.Error("gpu pool (cpu fallback on) not ok")
	}
	if by["strict"].OK() || !strings.Contains(out.String(), "REFUSED: the pool has cpu_fallback = false") {
		t.Error("strict pool with a CPU-only model: ok, or the listing does not say it is refused")
	}
	if p := placement("plain", "cpuonly"); p.EP != "cpu" || p.NodesByEP["cpu"] != 2 || len(p.NodesByEP) != 1 {
		t.Errorf("plain/cpuonly: %+v", p)
	}
}

// TestDoctorWebGPUNotTheGPU: a webgpu pool naming cuda:0 while Vulkan's adapter is
// lavapipe's CPU device fails, naming llvmpipe and the device; with adapter_mismatch =
// "flag" it is ok, flagged, the listing saying so; the same pool on device cpu is ok,
// unflagged.
func TestDoctorWebGPUNotTheGPU(t *testing.T) {
	testenv.OnlyLavapipe(t) // the pools' children inherit VK_DRIVER_FILES
	lib := testenv.RuntimeLib(t, "1.30.0")
	xdg := t.TempDir()
	if err := os.Chmod(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	env := fmt.Sprintf("env = { XDG_RUNTIME_DIR = %q }", xdg)
	reports, out := runDoctor(t, pool("nvidia", lib, `ep = "webgpu"`, `device = "cuda:0"`, env)+pool("lava", lib, `ep = "webgpu"`, `device = "cpu"`, env)+
		pool("flagged", lib, `ep = "webgpu"`, `device = "cuda:0"`, `adapter_mismatch = "flag"`, env))
	if a, _ := reports["nvidia"].Vulkan.Picked(); a.Type != "cpu" {
		t.Fatalf("the pool's Vulkan picked %s, not lavapipe alone", a)
	}
	n := reports["nvidia"]
	if n == nil || n.OK() || n.Error == nil || !strings.Contains(n.Error.Message, "llvmpipe") || !strings.Contains(n.Error.Message, "cuda:0") {
		t.Errorf("webgpu pool on cuda:0 served by llvmpipe: %+v", n)
	}
	if l := reports["lava"]; l == nil || !l.OK() || l.AdapterMismatch != "" {
		t.Errorf("webgpu pool on device cpu: %+v", l)
	}
	if f := reports["flagged"]; f == nil || !f.OK() || !strings.Contains(f.AdapterMismatch, "not a GPU (device cuda:0)") {
		t.Errorf("webgpu pool on cuda:0 with adapter_mismatch = \"flag\": %+v", f)
	}
	if !strings.Contains(out, "NOT device cuda:0") || !regexp.MustCompile(`pool flagged +ok, FLAGGED: not on its device's GPU`).MatchString(out) {
		t.Errorf("the listing does not flag the pools")
	}
}
