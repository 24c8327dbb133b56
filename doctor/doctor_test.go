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

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices/vulkan"
	"github.com/ortbus/ortbus/doctor"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// probeChildEnv turns this test binary into the doctor's probe process (what
// `ortbus doctor-probe` is): doctor.Run starts it as `self -config FILE -pool P`.
const probeChildEnv = "ORTBUS_TEST_DOCTOR_PROBE"

func TestMain(m *testing.M) {
	if os.Getenv(probeChildEnv) == "1" {
		os.Exit(doctor.ProbeMain(os.Args[1:]))
	}
	os.Exit(testenv.RunMain(m))
}

// runDoctor writes pools (TOML tables of [pools.NAME], runtime and the rest given) into a
// config with one raw model (its model.onnx present: the doctor checks model files), runs the doctor on it, each pool in a child process (this
// test binary), and returns the reports by pool and the printed listing.
func runDoctor(t *testing.T, pools string) (map[string]*doctor.Report, string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.onnx"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ortbus.toml")
	text := "[nats]\nurl = \"nats://127.0.0.1:1\"\n[models.tiny]\nkind = \"raw\"\ndir = \".\"\n" + pools
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
	reports := doctor.Run(cfg, self, []string{"-config", path}, 60*time.Second)
	var out bytes.Buffer
	doctor.Print(&out, reports)
	t.Logf("doctor:\n%s", out.String())
	byPool := map[string]*doctor.Report{}
	for _, r := range reports {
		byPool[r.Pool] = r
	}
	return byPool, out.String()
}

func pool(name, lib string, lines ...string) string {
	return fmt.Sprintf("[pools.%s]\nruntime = %q\nclasses = [\"interactive\"]\nmodels = [\"tiny\"]\n%s\n", name, lib, strings.Join(lines, "\n"))
}

// TestDoctorWebGPU: on lavapipe, a webgpu pool is OK on webgpu and its report names the
// adapter (Mesa llvmpipe, cpu, backend Vulkan, the driver); the same pool with a Vulkan
// driver list naming no file falls back to cpu when its chain has cpu, and says so, and
// fails without it, naming the missing file; with no Vulkan loader (the test hook
// ORTBUS_VULKAN_LOADER naming a missing library) it fails, naming libvulkan.so.1 and the
// package libvulkan1. A cpu pool is probed for webgpu too, and has no Vulkan report.
func TestDoctorWebGPU(t *testing.T) {
	testenv.RequireLavapipe(t)
	lib := testenv.RuntimeLib(t, "1.30.0")
	xdg := t.TempDir()
	if err := os.Chmod(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	noDriver := filepath.Join(t.TempDir(), "no-driver.json")
	noDriverEnv := fmt.Sprintf("env = { VK_DRIVER_FILES = %q, VK_ICD_FILENAMES = %q, XDG_RUNTIME_DIR = %q }", noDriver, noDriver, xdg)
	reports, out := runDoctor(t,
		pool("gpu", lib, `ep = "webgpu"`, `device = "cpu"`, fmt.Sprintf("env = { XDG_RUNTIME_DIR = %q }", xdg))+
			pool("chain", lib, `ep = "webgpu"`, `fallback = ["cpu"]`, `device = "cpu"`, noDriverEnv)+
			pool("strict", lib, `ep = "webgpu"`, `device = "cpu"`, noDriverEnv)+
			pool("noloader", lib, `ep = "webgpu"`, `device = "cpu"`,
				fmt.Sprintf("env = { %s = \"libvulkan-ortbus-missing.so.1\", XDG_RUNTIME_DIR = %q }", vulkan.LoaderEnv, xdg))+
			pool("plain", lib))

	gpu := reports["gpu"]
	if gpu == nil || !gpu.OK() || gpu.Usable != "webgpu" || gpu.EPs["webgpu"] != "ok" || gpu.Fallback != "" {
		t.Fatalf("gpu pool: %+v", gpu)
	}
	a, ok := gpu.Vulkan.Picked()
	if !ok || !strings.Contains(a.Name, "llvmpipe") {
		t.Errorf("gpu pool: picked adapter %+v", a)
	}
	for _, want := range []string{"adapter Mesa llvmpipe", "cpu", "backend Vulkan", "driver llvmpipe Mesa"} {
		if !strings.Contains(gpu.WebGPU, want) {
			t.Errorf("gpu pool: webgpu line lacks %q: %s", want, gpu.WebGPU)
		}
	}

	chain := reports["chain"]
	if chain == nil || !chain.OK() || chain.Usable != "cpu" || chain.EPs["webgpu"] == "ok" ||
		!strings.Contains(chain.Fallback, "falls back to cpu") {
		t.Errorf("chain pool: %+v", chain)
	}
	strict := reports["strict"]
	if strict == nil || strict.OK() || strict.Error == nil {
		t.Fatalf("strict pool: %+v", strict)
	}
	for _, r := range []*doctor.Report{chain, strict} {
		for _, want := range []string{"no Vulkan driver", "VK_DRIVER_FILES", noDriver} {
			if !strings.Contains(r.WebGPU, want) {
				t.Errorf("pool %s: webgpu line lacks %q: %s", r.Pool, want, r.WebGPU)
			}
		}
	}
	if !strings.Contains(strict.Error.Message, noDriver) {
		t.Errorf("strict pool: error %q does not name %s", strict.Error.Message, noDriver)
	}

	noloader := reports["noloader"]
	if noloader == nil || noloader.OK() || noloader.Error == nil || noloader.Vulkan == nil || noloader.Vulkan.LoaderErr == "" {
		t.Fatalf("noloader pool: %+v", noloader)
	}
	for _, want := range []string{"no Vulkan loader", "libvulkan.so.1", "libvulkan1"} {
		if !strings.Contains(noloader.Error.Message, want) {
			t.Errorf("noloader pool: error lacks %q: %s", want, noloader.Error.Message)
		}
	}

	plain := reports["plain"]
	if plain == nil || !plain.OK() || plain.Usable != "cpu" || plain.Vulkan != nil || plain.WebGPU != "" || plain.EPs["webgpu"] == "" {
		t.Errorf("cpu pool: %+v", plain)
	}

	for _, want := range []string{
		"pool gpu", "vulkan adapter", "llvmpipe", "<= webgpu's", "webgpu (usable: webgpu)",
		"pool chain", "the pool falls back to cpu", "vulkan missing", noDriver,
		"pool strict", "pool noloader", "FAIL", "apt-get install libvulkan1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q", want)
		}
	}
	// "ep webgpu ok" is said of the webgpu pool (its adapter checked), never of the cpu one.
	_, plainListing, _ := strings.Cut(out, "pool plain")
	gpuListing, _, _ := strings.Cut(strings.SplitN(out, "pool gpu", 2)[1], "\npool ")
	if !regexp.MustCompile(`ep webgpu +ok\n`).MatchString(gpuListing) || !regexp.MustCompile(`ep webgpu +can be appended \(not in this pool's chain: no adapter checked\)`).MatchString(plainListing) ||
		regexp.MustCompile(`ep webgpu +ok`).MatchString(plainListing) {
		t.Errorf("ep webgpu lines: the webgpu pool's\n%s\nthe cpu pool's\n%s", gpuListing, plainListing)
	}
}

// TestDoctorWebGPUNoRuntime: a webgpu pool whose runtime is missing still reports what
// Vulkan offers (the probe runs before the runtime is looked for), and fails.
func TestDoctorWebGPUNoRuntime(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nowhere", "libonnxruntime.so.1")
	reports, _ := runDoctor(t, pool("gpu", missing, `ep = "webgpu"`, `device = "cpu"`))
	r := reports["gpu"]
	if r == nil || r.OK() || r.Error == nil || r.Vulkan == nil || r.WebGPU == "" {
		t.Fatalf("report: %+v", r)
	}
}

// TestDoctorMissingModelDir: a pool one of whose models has a `dir` that does not exist is
// not OK; its report names the model and the path (file_not_found), as does the listing.
func TestDoctorMissingModelDir(t *testing.T) {
	lib := testenv.RuntimeLib(t, "1.30.0")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.onnx"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ortbus.toml")
	text := "[nats]\nurl = \"nats://127.0.0.1:1\"\n[models.tiny]\nkind = \"raw\"\ndir = \".\"\n[models.gone]\nkind = \"raw\"\ndir = \"./nope\"\n" +
		fmt.Sprintf("[pools.p]\nruntime = %q\nclasses = [\"interactive\"]\nmodels = [\"tiny\", \"gone\"]\n", lib)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	t.Setenv(probeChildEnv, "1")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	reports := doctor.Run(cfg, self, []string{"-config", path}, 60*time.Second)
	var out bytes.Buffer
	doctor.Print(&out, reports)
	if len(reports) != 1 {
		t.Fatalf("%d reports", len(reports))
	}
	r, gone := reports[0], filepath.Join(dir, "nope")
	e := r.Models["gone"]
	if r.OK() || e == nil || e.Code != codec.CodeFileNotFound || e.Details["path"] != gone || r.Models["tiny"] != nil {
		t.Errorf("pool with a model whose dir is missing: OK %v, models %+v; want not OK, gone: file_not_found naming %s", r.OK(), r.Models, gone)
	}
	if !strings.Contains(out.String(), "FAIL") || !strings.Contains(out.String(), "model gone") || !strings.Contains(out.String(), gone) {
		t.Errorf("listing:\n%s", out.String())
	}
}
