package testenv

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/devices/vulkan"
)

// RequireVulkan is what a webgpu test needs of the machine: a Vulkan loader
// (libvulkan.so.1) that lists an adapter (vulkan.Probe, in this process: the Vulkan
// loader is not ONNX Runtime, one per process does not bind it). Where there is none, t
// is skipped, saying what is missing and what installs it — or failed under CI (CI set),
// whose .ci/run installs the loader and lavapipe (scripts/install-vulkan.sh): there the
// webgpu path must run, never skip. It returns the probe's report.
func RequireVulkan(t testing.TB) *vulkan.Report {
	t.Helper()
	r := vulkan.Probe(context.Background())
	if p := r.Problem(); p != "" {
		skipOrFail(t, p)
	}
	return r
}

// RequireVulkanLoader is RequireVulkan for a test that needs only the Vulkan loader
// (libvulkan.so.1), not an adapter: one that checks what is reported without a driver.
func RequireVulkanLoader(t testing.TB) {
	t.Helper()
	if r := vulkan.Probe(context.Background()); r.LoaderErr != "" {
		skipOrFail(t, "no Vulkan loader ("+r.LoaderErr+")")
	}
}

// RequireLavapipe is RequireVulkan for a test that names lavapipe's adapter (llvmpipe) in
// what it checks: one among the adapters the loader lists.
func RequireLavapipe(t testing.TB) *vulkan.Report {
	t.Helper()
	r := RequireVulkan(t)
	if !slices.ContainsFunc(r.Adapters, func(a vulkan.Adapter) bool { return strings.Contains(a.Name, "llvmpipe") }) {
		skipOrFail(t, "no lavapipe (llvmpipe) among the Vulkan adapters")
	}
	return r
}

// OnlyLavapipe is RequireLavapipe for a test that needs lavapipe to be the only Vulkan
// adapter (Dawn's pick): it sets VK_DRIVER_FILES, for the rest of t and the processes t
// starts, to lavapipe's driver manifest alone, so that a machine whose Vulkan also has a
// GPU still stages the llvmpipe case. It returns lavapipe's adapter, as then probed.
func OnlyLavapipe(t *testing.T) vulkan.Adapter {
	t.Helper()
	r := RequireLavapipe(t)
	i := slices.IndexFunc(r.ICDFiles, func(f string) bool { return strings.HasPrefix(filepath.Base(f), "lvp_icd") })
	if i < 0 {
		t.Fatalf("llvmpipe is listed but no lvp_icd*.json is among the manifests %v", r.ICDFiles)
	}
	t.Setenv("VK_DRIVER_FILES", r.ICDFiles[i])
	t.Setenv("VK_ICD_FILENAMES", r.ICDFiles[i])
	a, ok := vulkan.Probe(context.Background()).Picked()
	if !ok || a.Type != "cpu" || !strings.Contains(a.Name, "llvmpipe") {
		t.Fatalf("with VK_DRIVER_FILES=%s Dawn's pick is %v (%v), not llvmpipe", r.ICDFiles[i], a, ok)
	}
	return a
}

func skipOrFail(t testing.TB, why string) {
	t.Helper()
	skipOrFailBecause(t, why+" (as root, scripts/install-vulkan.sh installs the Vulkan loader and lavapipe, Mesa's Vulkan on the CPU)")
}

// skipOrFailBecause is Unavailable.
func skipOrFailBecause(t testing.TB, why string) {
	t.Helper()
	Unavailable(t, why)
}

// WebGPUEnv is the environment a process running the webgpu EP needs beside its own:
// XDG_RUNTIME_DIR, which Dawn reads (it logs an error without one), as a private
// directory of t's.
func WebGPUEnv(t testing.TB) map[string]string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return map[string]string{"XDG_RUNTIME_DIR": d}
}
