package bench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/devices/vulkan"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// standInNVIDIASMI puts first on PATH an nvidia-smi that names an NVIDIA H200 (as
// `--query-gpu=name,pci.device_id` prints it) and lists no process, while the machine's
// Vulkan has lavapipe alone: the case where a GPU figure would be llvmpipe's.
func standInNVIDIASMI(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	script := "#!/bin/sh\ncase \"$*\" in\n*--query-gpu=name,pci.device_id*) echo 'NVIDIA H200, 0x233510DE' ;;\n" +
		"*--query-gpu*) echo 'NVIDIA H200, 143771, 580.95.05' ;;\n*) ;;\nesac\nexit 0\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// requireOnlyLavapipe is testenv.OnlyLavapipe: lavapipe the only Vulkan driver (a machine
// whose Vulkan also has a GPU stages the llvmpipe-against-a-GPU case all the same).
func requireOnlyLavapipe(t *testing.T) vulkan.Adapter {
	t.Helper()
	return testenv.OnlyLavapipe(t)
}

// TestNotTheGPU: what vulkan.NotTheGPU accepts for each kind of device.
func TestNotTheGPU(t *testing.T) {
	llvm := vulkan.Adapter{Name: "llvmpipe (LLVM 15.0.6, 256 bits)", Vendor: "Mesa", VendorID: 0x10005, Type: "cpu"}
	h200 := vulkan.Adapter{Name: "NVIDIA H200", Vendor: "NVIDIA", VendorID: 0x10de, DeviceID: 0x2335, Type: "discrete"}
	amd := vulkan.Adapter{Name: "AMD Radeon", Vendor: "AMD", VendorID: 0x1002, DeviceID: 0x744c, Type: "discrete"}
	for _, c := range []struct {
		a      vulkan.Adapter
		device string
		pci    uint32
		bad    string // a word the reason must hold; "" = the adapter may be the GPU
	}{
		{llvm, "cuda:0", 0, "not a GPU"}, {llvm, "drm:1", 0, "not a GPU"}, {llvm, "cpu", 0, ""},
		{h200, "cuda:0", 0x2335, ""}, {h200, "cuda:0", 0, ""}, {h200, "cuda:0", 0x2330, "device id"},
		{amd, "cuda:0", 0, "not NVIDIA's"}, {amd, "drm:0", 0, ""},
	} {
		why := vulkan.NotTheGPU(c.a, c.device, c.pci)
		if (c.bad == "") != (why == "") || !strings.Contains(why, c.bad) {
			t.Errorf("%s on %s (pci 0x%x): %q, want %q", c.a.Name, c.device, c.pci, why, c.bad)
		}
	}
	g := findGPU(func() ([]byte, error) { return []byte("NVIDIA H200, 0x233510DE\n"), nil }, nil)
	if g.Device != "cuda:0" || g.PCIDevice != 0x2335 || g.What != "NVIDIA H200 (nvidia-smi)" {
		t.Errorf("nvidia-smi with pci.device_id: %+v", g)
	}
}

// TestAdapterMismatchFails: under a stand-in nvidia-smi naming an NVIDIA GPU while only
// lavapipe is installed, each GPU bench path (throughput -ep webgpu, tune -ep webgpu, the
// collision on the GPU) fails before measuring anything, naming llvmpipe against the GPU
// and saying its figures would not be a GPU's.
func TestAdapterMismatchFails(t *testing.T) {
	requireOnlyLavapipe(t)
	standInNVIDIASMI(t)
	if g := detectGPU(); g.Device != "cuda:0" || g.PCIDevice != 0x2335 {
		t.Fatalf("the stand-in nvidia-smi is not what detectGPU sees: %+v", g)
	}
	root := testenv.RepoRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: ran on llvmpipe under an NVIDIA GPU without failing", what)
			return
		}
		t.Logf("%s: %v", what, err)
		for _, want := range []string{NotGPUFigure, "llvmpipe", "NVIDIA H200", "cuda:0"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v: no %q", what, err, want)
			}
		}
	}
	// The binaries are never started: each path fails at its GPU check, before the
	// system starts (a started one would fail on these empty files, not on the check).
	bin := t.TempDir()
	for _, b := range []string{"gateway", "ortworker"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\nexit 3\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	_, err := Throughput(ctx, Options{Repo: root, BinDir: bin, EP: "webgpu", Smoke: true, Out: &out})
	check("throughput -ep webgpu", err)
	_, err = Collision(ctx, Options{Repo: root, BinDir: bin, Scenario: "gpu-short", Out: &out})
	check("collision -scenario gpu-short", err)
	t.Logf("output:\n%s", out.String())
}

// TestGPUCheckAdapterMismatch: scripts/gpu-check.sh under the stand-in nvidia-smi, with
// only lavapipe's Vulkan, exits 1 naming the mismatch (llvmpipe against the NVIDIA GPU)
// and the figures as not a GPU's, and runs none of the steps after it; its summary.txt
// has the steps' times, the failure, and the figures needing another vendor's GPU. The script runs
// from a copy of the repository's layout (scripts/, bin/ built here, .deps linked).
func TestGPUCheckAdapterMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the system and runs scripts/gpu-check.sh; skipped with -short")
	}
	requireOnlyLavapipe(t)
	root := testenv.RepoRoot(t)
	testenv.RuntimeLib(t, RuntimeVersion)
	bin := buildSystem(t, root)
	standInNVIDIASMI(t)
	repo := t.TempDir()
	script, err := os.ReadFile(filepath.Join(root, "scripts", "gpu-check.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{os.Mkdir(filepath.Join(repo, "scripts"), 0o755),
		os.WriteFile(filepath.Join(repo, "scripts", "gpu-check.sh"), script, 0o755),
		os.Symlink(bin, filepath.Join(repo, "bin")), os.Symlink(filepath.Join(root, ".deps"), filepath.Join(repo, ".deps"))} {
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repo, "scripts", "gpu-check.sh"), out)
	cmd.Env = append(os.Environ(), "TUNE_DURATION=200ms", "BENCH_DURATION=300ms")
	b, err := cmd.CombinedOutput()
	t.Logf("gpu-check.sh:\n%s", b)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("gpu-check.sh: %v, want exit status 1", err)
	}
	s := string(b)
	for _, want := range []string{"FAIL: tune: ", NotGPUFigure, "llvmpipe", "NVIDIA H200", "the remaining steps are not run"} {
		if !strings.Contains(s, want) {
			t.Errorf("no %q in its output", want)
		}
	}
	for _, never := range []string{"== (b) bin/ortbus bench throughput", "== (c)", "== (d)", "every target met"} {
		if strings.Contains(s, never) {
			t.Errorf("%q in its output: it went on after the mismatch", never)
		}
	}
	// One summary table: the steps run, the failure named, and what needs another
	// vendor's GPU.
	summary, err := os.ReadFile(filepath.Join(out, "summary.txt"))
	if err != nil {
		t.Fatalf("no summary.txt: %v", err)
	}
	for _, want := range []string{"doctor       | time", "tune         | time", "| FAIL", NotGPUFigure, "needs another vendor's GPU", "drm:N (AMD, Intel)"} {
		if !strings.Contains(string(summary), want) {
			t.Errorf("summary.txt lacks %q:\n%s", want, summary)
		}
	}
}
