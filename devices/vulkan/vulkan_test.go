package vulkan_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ortbus/ortbus/devices/vulkan"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestVulkanProbeLavapipe: with lavapipe installed (scripts/install-vulkan.sh, as CI
// does), the probe loads the loader, finds lavapipe's manifest by the loader's own search,
// and lists llvmpipe, a Mesa CPU device with its driver named; Dawn's pick is an adapter
// (llvmpipe, unless the machine has a GPU). Probes from several goroutines at once all
// succeed (they run one at a time). The variables that redirect the loader's search are
// unset for the test (the loader reads them at each vkCreateInstance; with cgo, Go's
// Unsetenv is the C library's).
func TestVulkanProbeLavapipe(t *testing.T) {
	for _, env := range []string{"VK_DRIVER_FILES", "VK_ICD_FILENAMES", "VK_ADD_DRIVER_FILES", vulkan.LoaderEnv} {
		t.Setenv(env, "") // restored after the test
		os.Unsetenv(env)
	}
	r := testenv.RequireLavapipe(t)
	b, _ := json.MarshalIndent(r, "", "  ")
	t.Logf("probe:\n%s", b)
	if !filepath.IsAbs(r.Loader) || !strings.Contains(r.Loader, "libvulkan.so.1") {
		t.Errorf("Loader = %q, want the loaded library's path", r.Loader)
	}
	if r.ICDSource != "search" || !slices.Contains(r.ICDSearched, "/usr/share/vulkan/icd.d") || !slices.Contains(r.ICDSearched, "/etc/vulkan/icd.d") {
		t.Errorf("ICD search: source %q, dirs %v", r.ICDSource, r.ICDSearched)
	}
	lvp := slices.ContainsFunc(r.ICDFiles, func(f string) bool { return strings.HasPrefix(filepath.Base(f), "lvp_icd") })
	if !lvp {
		t.Errorf("llvmpipe is listed but its manifest (lvp_icd*.json) is not among %s", strings.Join(r.ICDFiles, ", "))
	}
	i := slices.IndexFunc(r.Adapters, func(a vulkan.Adapter) bool { return strings.Contains(a.Name, "llvmpipe") })
	a := r.Adapters[i]
	if a.Type != "cpu" || a.VendorID != 0x10005 || a.Vendor != "Mesa" || a.DriverName != "llvmpipe" || !strings.Contains(a.DriverInfo, "Mesa") || !strings.HasPrefix(a.API, "1.") {
		t.Errorf("llvmpipe adapter: %+v", a)
	}
	if p := r.Problem(); p != "" {
		t.Errorf("Problem() = %q with an adapter", p)
	}
	if _, ok := r.Picked(); !ok {
		t.Error("Picked: no adapter")
	}
	if s := a.String(); !strings.Contains(s, "llvmpipe") || !strings.Contains(s, "Vulkan") || !strings.Contains(s, "cpu") {
		t.Errorf("String() = %q", s)
	}

	var wg sync.WaitGroup
	names := make([][]string, 4)
	for g := range names {
		wg.Go(func() {
			for _, a := range vulkan.Probe(context.Background()).Adapters {
				names[g] = append(names[g], a.Name)
			}
		})
	}
	wg.Wait()
	for g, n := range names {
		if !slices.Contains(n, a.Name) {
			t.Errorf("concurrent probe %d: adapters %v", g, n)
		}
	}
}

const noDriverChild = "TestVulkanNoDriverChild"

// TestVulkanNoDriver: with VK_DRIVER_FILES naming a file that does not exist (in a child
// process: the loader reads its environment there), the loader loads, Vulkan lists no
// adapter, and the report says where the drivers were taken from, that the file is
// missing, and what to install.
func TestVulkanNoDriver(t *testing.T) {
	testenv.RequireVulkanLoader(t)
	missing := filepath.Join(t.TempDir(), "no-driver.json")
	testenv.RunChild(t, noDriverChild, "VK_DRIVER_FILES="+missing, "VK_ICD_FILENAMES="+missing, "ORTBUS_TEST_MISSING_ICD="+missing)
}

func TestVulkanNoDriverChild(t *testing.T) {
	if !testenv.InChild(noDriverChild) {
		t.Skip("runs only as a child process of TestVulkanNoDriver")
	}
	missing := os.Getenv("ORTBUS_TEST_MISSING_ICD")
	r := vulkan.Probe(context.Background())
	b, _ := json.MarshalIndent(r, "", "  ")
	t.Logf("probe:\n%s", b)
	if r.LoaderErr != "" || r.Loader == "" {
		t.Fatalf("loader: %q %q", r.Loader, r.LoaderErr)
	}
	if len(r.Adapters) != 0 {
		t.Errorf("adapters without a driver: %+v", r.Adapters)
	}
	if _, ok := r.Picked(); ok {
		t.Error("Picked found an adapter")
	}
	if r.ICDSource != "VK_DRIVER_FILES" || !slices.Equal(r.ICDSearched, []string{missing}) ||
		!slices.Equal(r.ICDMissing, []string{missing}) || len(r.ICDFiles) != 0 {
		t.Errorf("ICDs: source %q searched %v missing %v files %v", r.ICDSource, r.ICDSearched, r.ICDMissing, r.ICDFiles)
	}
	if !strings.Contains(r.Err, "vkCreateInstance") {
		t.Errorf("Err = %q, want vkCreateInstance's failure", r.Err)
	}
	p := r.Problem()
	for _, want := range []string{"no Vulkan driver", "VK_DRIVER_FILES", missing, "install-vulkan.sh"} {
		if !strings.Contains(p, want) {
			t.Errorf("Problem() lacks %q: %s", want, p)
		}
	}
}

// TestVulkanLoaderMissing: a loader that cannot be loaded (ORTBUS_VULKAN_LOADER naming a
// library that does not exist, the test hook for a machine without libvulkan.so.1) is a
// report, not a crash: no adapter, dlopen's error, and a Problem naming libvulkan.so.1
// and the package libvulkan1; the driver manifests are still listed.
func TestVulkanLoaderMissing(t *testing.T) {
	t.Setenv(vulkan.LoaderEnv, "libvulkan-ortbus-missing.so.1")
	r := vulkan.Probe(context.Background())
	if r.LoaderErr == "" || !strings.Contains(r.LoaderErr, "libvulkan-ortbus-missing.so.1") {
		t.Fatalf("LoaderErr = %q", r.LoaderErr)
	}
	if len(r.Adapters) != 0 || r.ICDSource == "" || len(r.ICDSearched) == 0 {
		t.Errorf("report: %+v", r)
	}
	p := r.Problem()
	for _, want := range []string{"no Vulkan loader", "libvulkan.so.1", "libvulkan1", "libvulkan-ortbus-missing.so.1", "install-vulkan.sh"} {
		if !strings.Contains(p, want) {
			t.Errorf("Problem() lacks %q: %s", want, p)
		}
	}
}

// TestVulkanProbeDeadline: a context already over answers at once with the report of
// what could be read without Vulkan (the manifests), not a hang.
func TestVulkanProbeDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := vulkan.Probe(ctx)
	// The probe may have won the race for the token and finished; either way it returned.
	if r.ICDSource == "" {
		t.Errorf("report without the ICD search: %+v", r)
	}
	if len(r.Adapters) == 0 && r.Err == "" && r.LoaderErr == "" {
		t.Errorf("no adapter and no reason: %+v", r)
	}
}

func TestVulkanVersionsAndVendors(t *testing.T) {
	for _, c := range []struct {
		vendor, v uint32
		want      string
	}{
		{0x10de, 535<<22 | 104<<14 | 5<<6, "535.104.5.0"},
		{0x10de, 580<<22 | 95<<14 | 5<<6 | 1, "580.95.5.1"},
		{0x10005, 25<<22 | 0<<12 | 7, "25.0.7"},
		{0x1002, 2<<22 | 0<<12 | 301, "2.0.301"},
		{0x8086, 24<<22 | 1<<12 | 2, "24.1.2"},
	} {
		if got := vulkan.DriverVersion(c.vendor, c.v); got != c.want {
			t.Errorf("VulkanDriverVersion(%#x, %#x) = %s, want %s", c.vendor, c.v, got, c.want)
		}
	}
	for id, want := range map[uint32]string{0x10de: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x10005: "Mesa", 0xabcd: "0xabcd"} {
		if got := vulkan.Vendor(id); got != want {
			t.Errorf("VulkanVendor(%#x) = %s, want %s", id, got, want)
		}
	}
}

// TestVulkanPicked: Dawn's high-performance order — discrete, integrated, cpu, then the
// rest (virtual, other) — the loader's order kept among equals.
func TestVulkanPicked(t *testing.T) {
	ad := func(name, typ string) vulkan.Adapter { return vulkan.Adapter{Name: name, Type: typ} }
	for _, c := range []struct {
		adapters []vulkan.Adapter
		want     string
	}{
		{[]vulkan.Adapter{ad("llvmpipe", "cpu"), ad("igpu", "integrated"), ad("dgpu", "discrete")}, "dgpu"},
		{[]vulkan.Adapter{ad("llvmpipe", "cpu"), ad("igpu", "integrated")}, "igpu"},
		{[]vulkan.Adapter{ad("vgpu", "virtual"), ad("llvmpipe", "cpu")}, "llvmpipe"},
		{[]vulkan.Adapter{ad("other", "other"), ad("vgpu", "virtual")}, "other"},
		{[]vulkan.Adapter{ad("dgpu0", "discrete"), ad("dgpu1", "discrete")}, "dgpu0"},
	} {
		r := &vulkan.Report{Adapters: c.adapters}
		if a, ok := r.Picked(); !ok || a.Name != c.want {
			t.Errorf("Picked(%v) = %v %v, want %s", c.adapters, a.Name, ok, c.want)
		}
	}
	var none *vulkan.Report
	if _, ok := none.Picked(); ok || (&vulkan.Report{}).PickedIndex() != -1 {
		t.Error("Picked without adapters")
	}
}
