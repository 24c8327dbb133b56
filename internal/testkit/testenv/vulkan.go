package testenv

import (
	"context"
	"os"
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

func skipOrFail(t testing.TB, why string) {
	t.Helper()
	skipOrFailBecause(t, why+" (as root, scripts/install-vulkan.sh installs the Vulkan loader and lavapipe, Mesa's Vulkan on the CPU)")
}

// skipOrFailBecause skips t saying why, or fails it under CI (CI set), where what the test
// needs is installed first and its absence is a fault.
func skipOrFailBecause(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
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
