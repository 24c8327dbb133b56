package vulkan

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestVulkanICDs: the driver manifests are found as the Vulkan loader finds them: an
// environment list (files and directories, a missing entry noted) replaces the search;
// without one the XDG directories are searched in the loader's order, with their
// defaults, each + vulkan/icd.d, VK_ADD_DRIVER_FILES first, only *.json files kept.
func TestVulkanICDs(t *testing.T) {
	dir := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := mk("data/a/vulkan/icd.d/a.json")
	mk("data/a/vulkan/icd.d/readme.txt")
	b := mk("data/b/vulkan/icd.d/b.json")
	extra := mk("extra/x.json")
	listed := mk("listed/l.json")
	ldir1 := mk("listdir/1.json")
	ldir2 := mk("listdir/2.json")
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

	// An environment list replaces the search; VK_DRIVER_FILES wins over VK_ICD_FILENAMES.
	gone := filepath.Join(dir, "gone.json")
	src, searched, files, missing := vulkanICDs(env(map[string]string{
		"VK_DRIVER_FILES":  listed + ":" + gone + "::" + filepath.Dir(ldir1),
		"VK_ICD_FILENAMES": extra,
		"XDG_DATA_DIRS":    filepath.Join(dir, "data/a"),
	}))
	if src != "VK_DRIVER_FILES" || !slices.Equal(files, []string{listed, ldir1, ldir2}) || !slices.Equal(missing, []string{gone}) ||
		!slices.Equal(searched, []string{listed, gone, filepath.Dir(ldir1)}) {
		t.Errorf("VK_DRIVER_FILES: %s %v %v %v", src, searched, files, missing)
	}
	src, _, files, _ = vulkanICDs(env(map[string]string{"VK_ICD_FILENAMES": extra}))
	if src != "VK_ICD_FILENAMES" || !slices.Equal(files, []string{extra}) {
		t.Errorf("VK_ICD_FILENAMES: %s %v", src, files)
	}

	// The search: XDG_DATA_DIRS in its order, VK_ADD_DRIVER_FILES first.
	src, searched, files, missing = vulkanICDs(env(map[string]string{
		"HOME":                filepath.Join(dir, "home"),
		"XDG_DATA_DIRS":       filepath.Join(dir, "data/b") + ":" + filepath.Join(dir, "data/a") + ":relative",
		"VK_ADD_DRIVER_FILES": extra,
	}))
	if src != "search" || !slices.Equal(files, []string{extra, b, a}) || len(missing) != 0 {
		t.Errorf("search: %s files %v missing %v", src, files, missing)
	}
	want := []string{extra, filepath.Join(dir, "home/.config/vulkan/icd.d"), "/etc/xdg/vulkan/icd.d", "/etc/vulkan/icd.d",
		filepath.Join(dir, "home/.local/share/vulkan/icd.d"), filepath.Join(dir, "data/b/vulkan/icd.d"), filepath.Join(dir, "data/a/vulkan/icd.d")}
	if !slices.Equal(searched, want) {
		t.Errorf("searched\n%v, want\n%v", searched, want)
	}

	// Defaults: no XDG variables, no HOME.
	_, searched, _, _ = vulkanICDs(env(nil))
	want = []string{"/etc/xdg/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/usr/share/vulkan/icd.d"}
	if !slices.Equal(searched, want) {
		t.Errorf("default dirs %v, want %v", searched, want)
	}
}

// TestVulkanProblem: each missing piece is named with what installs it.
func TestVulkanProblem(t *testing.T) {
	for _, c := range []struct {
		r    Report
		want []string
	}{
		{Report{Loader: "libvulkan.so.1", LoaderErr: "libvulkan.so.1: cannot open shared object file"},
			[]string{"no Vulkan loader", "libvulkan.so.1", "libvulkan1", "install-vulkan.sh"}},
		{Report{Loader: "/l", ICDSource: "search", ICDSearched: []string{"/etc/vulkan/icd.d", "/usr/share/vulkan/icd.d"}},
			[]string{"no Vulkan driver", "/etc/vulkan/icd.d, /usr/share/vulkan/icd.d", "mesa-vulkan-drivers", "install-vulkan.sh"}},
		{Report{Loader: "/l", ICDSource: "VK_ICD_FILENAMES", ICDSearched: []string{"/x.json"}, ICDMissing: []string{"/x.json"}},
			[]string{"VK_ICD_FILENAMES lists /x.json", "missing: /x.json"}},
		{Report{Loader: "/l", ICDSource: "search", ICDFiles: []string{"/u/intel_icd.json", "/u/radeon_icd.json"}, Err: "vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER"},
			[]string{"no adapter", "/u/intel_icd.json, /u/radeon_icd.json", "VK_ERROR_INCOMPATIBLE_DRIVER"}},
	} {
		p := c.r.Problem()
		for _, w := range c.want {
			if !strings.Contains(p, w) {
				t.Errorf("Problem() of %+v lacks %q: %s", c.r, w, p)
			}
		}
	}
	ok := Report{Loader: "/l", ICDFiles: []string{"/u/lvp_icd.json"}, Adapters: []Adapter{{Name: "llvmpipe", Type: "cpu"}}}
	if p := ok.Problem(); p != "" {
		t.Errorf("Problem() with an adapter = %q", p)
	}
}
