package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// VulkanLoaderDirs are where the Vulkan loader (libvulkan.so.1) is looked for by
// HasVulkan: the loader's own default library directories on Debian and Ubuntu, then
// LD_LIBRARY_PATH's.
func VulkanLoaderDirs() []string {
	dirs := []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"}
	for _, d := range strings.Split(os.Getenv("LD_LIBRARY_PATH"), ":") {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// HasVulkan reports whether this machine has the Vulkan loader and at least one driver
// (ICD) file: what ONNX Runtime's WebGPU EP (Dawn over Vulkan) needs to find an adapter.
func HasVulkan() bool {
	loader := false
	for _, d := range VulkanLoaderDirs() {
		if st, err := os.Stat(filepath.Join(d, "libvulkan.so.1")); err == nil && !st.IsDir() {
			loader = true
			break
		}
	}
	if !loader {
		return false
	}
	if f := os.Getenv("VK_DRIVER_FILES") + os.Getenv("VK_ICD_FILENAMES"); f != "" {
		return true // the caller chose its drivers
	}
	for _, d := range []string{"/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d"} {
		if m, _ := filepath.Glob(filepath.Join(d, "*.json")); len(m) > 0 {
			return true
		}
	}
	return false
}

// RequireVulkan skips t where the machine has no Vulkan (HasVulkan), saying what installs
// it, and fails it instead under CI (CI=true), whose .ci/run installs lavapipe
// (scripts/install-vulkan.sh): there the webgpu path must run, never skip.
func RequireVulkan(t testing.TB) {
	t.Helper()
	if HasVulkan() {
		return
	}
	const why = "no Vulkan loader (libvulkan.so.1) or no Vulkan driver (ICD): the webgpu EP has no adapter; as root, scripts/install-vulkan.sh installs the loader and lavapipe"
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
