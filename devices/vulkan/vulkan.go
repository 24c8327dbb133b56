package vulkan

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The few Vulkan declarations the probe needs, written here from the Vulkan ABI (vulkan_core.h)
// so that neither the Vulkan headers nor libvulkan are needed to build: the loader is
// dlopen()ed at run time. On Linux VKAPI_CALL is the platform's C calling convention.

typedef int32_t ovk_result;        // VkResult
typedef void *ovk_instance;        // VkInstance (a dispatchable handle: a pointer)
typedef void *ovk_physical_device; // VkPhysicalDevice (likewise)
typedef void (*ovk_void_fn)(void); // PFN_vkVoidFunction

typedef struct {                   // VkApplicationInfo
	uint32_t sType;                // VK_STRUCTURE_TYPE_APPLICATION_INFO = 0
	const void *pNext;
	const char *pApplicationName;
	uint32_t applicationVersion;
	const char *pEngineName;
	uint32_t engineVersion;
	uint32_t apiVersion;
} ovk_application_info;

typedef struct {                   // VkInstanceCreateInfo
	uint32_t sType;                // VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1
	const void *pNext;
	uint32_t flags;                // VkInstanceCreateFlags
	const ovk_application_info *pApplicationInfo;
	uint32_t enabledLayerCount;
	const char *const *ppEnabledLayerNames;
	uint32_t enabledExtensionCount;
	const char *const *ppEnabledExtensionNames;
} ovk_instance_create_info;

// The leading members of VkPhysicalDeviceProperties. The whole struct (limits, a large
// struct, then sparseProperties) is 824 bytes on LP64; the driver writes it into a buffer
// of several times that, and only these members are read.
typedef struct {
	uint32_t apiVersion;
	uint32_t driverVersion;
	uint32_t vendorID;
	uint32_t deviceID;
	int32_t deviceType;            // VkPhysicalDeviceType
	char deviceName[256];          // VK_MAX_PHYSICAL_DEVICE_NAME_SIZE
	uint8_t pipelineCacheUUID[16]; // VK_UUID_SIZE
} ovk_properties_head;

typedef union {
	ovk_properties_head head;
	uint64_t align;                // limits holds VkDeviceSize and size_t members
	unsigned char raw[4096];
} ovk_properties;

_Static_assert(offsetof(ovk_properties_head, deviceType) == 16, "VkPhysicalDeviceProperties.deviceType");
_Static_assert(offsetof(ovk_properties_head, deviceName) == 20, "VkPhysicalDeviceProperties.deviceName");
_Static_assert(offsetof(ovk_properties_head, pipelineCacheUUID) == 276, "VkPhysicalDeviceProperties.pipelineCacheUUID");

// VkPhysicalDeviceDriverProperties (Vulkan 1.2, VK_KHR_driver_properties), chained to
// VkPhysicalDeviceProperties2, whose own head (sType, pNext) precedes the properties: the
// driver's name and its version as it prints it ("Mesa 25.0.7", NVIDIA's "580.95.05").
typedef struct {
	uint32_t sType;                // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES = 1000196000
	void *pNext;
	uint32_t driverID;             // VkDriverId
	char driverName[256];          // VK_MAX_DRIVER_NAME_SIZE
	char driverInfo[256];          // VK_MAX_DRIVER_INFO_SIZE
	uint8_t conformanceVersion[4]; // VkConformanceVersion
} ovk_driver_properties;

typedef struct {
	uint32_t sType;                // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2 = 1000059001
	void *pNext;
} ovk_properties2_head;

typedef union {
	ovk_properties2_head head;
	uint64_t align;
	unsigned char raw[4096];       // the head, then VkPhysicalDeviceProperties (824 bytes)
} ovk_properties2;

_Static_assert(offsetof(ovk_driver_properties, driverName) == 20, "VkPhysicalDeviceDriverProperties.driverName");
_Static_assert(offsetof(ovk_driver_properties, driverInfo) == 276, "VkPhysicalDeviceDriverProperties.driverInfo");
_Static_assert(sizeof(ovk_driver_properties) == 536, "sizeof VkPhysicalDeviceDriverProperties");

typedef ovk_void_fn (*ovk_get_instance_proc_addr_fn)(ovk_instance, const char *);
typedef ovk_result (*ovk_enumerate_instance_version_fn)(uint32_t *);
typedef ovk_result (*ovk_create_instance_fn)(const ovk_instance_create_info *, const void *, ovk_instance *);
typedef void (*ovk_destroy_instance_fn)(ovk_instance, const void *);
typedef ovk_result (*ovk_enumerate_physical_devices_fn)(ovk_instance, uint32_t *, ovk_physical_device *);
typedef void (*ovk_get_physical_device_properties_fn)(ovk_physical_device, ovk_properties *);
typedef void (*ovk_get_physical_device_properties2_fn)(ovk_physical_device, ovk_properties2 *);

#define OVK_MAX_DEVICES 16
#define OVK_MAKE_API_VERSION(major, minor) (((uint32_t)(major) << 22) | ((uint32_t)(minor) << 12))

typedef struct {
	uint32_t apiVersion, driverVersion, vendorID, deviceID;
	int32_t deviceType;
	char name[257];
	char driverName[257];          // empty where the device has no driver properties
	char driverInfo[257];
} ovk_device;

typedef struct {
	char loaderPath[1024];         // where the loader was found (dladdr), else empty
	char loaderError[1024];        // dlopen's or dlsym's error, else empty
	uint32_t instanceVersion;      // vkEnumerateInstanceVersion, 0 when the loader has none (1.0)
	const char *failedCall;        // the Vulkan call that failed, or NULL
	ovk_result result;             // its VkResult
	uint32_t total;                // physical devices the loader reported
	uint32_t count;                // of which in devices
	ovk_device devices[OVK_MAX_DEVICES];
} ovk_report;

// ovk_copy_name copies a fixed-size char array that a driver should have NUL-terminated
// but may not have.
static void ovk_copy_name(char *dst, const char *src, size_t srcSize) {
	size_t n = strnlen(src, srcSize);
	memcpy(dst, src, n);
	dst[n] = 0;
}

static void ovk_copy(char *dst, size_t size, const char *src) {
	if (src == NULL) {
		src = "unknown error";
	}
	size_t n = strnlen(src, size - 1);
	memcpy(dst, src, n);
	dst[n] = 0;
}

// ovk_probe dlopen()s the loader named name, creates a bare instance (no layers, no
// extensions), lists its physical devices and their properties, and destroys the instance.
// The loader stays loaded: see Probe.
static void ovk_probe(const char *name, ovk_report *r) {
	memset(r, 0, sizeof *r);
	dlerror();
	void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		ovk_copy(r->loaderError, sizeof r->loaderError, dlerror());
		return;
	}
	dlerror();
	ovk_get_instance_proc_addr_fn gipa = (ovk_get_instance_proc_addr_fn)dlsym(lib, "vkGetInstanceProcAddr");
	if (gipa == NULL) {
		const char *e = dlerror();
		ovk_copy(r->loaderError, sizeof r->loaderError, e ? e : "vkGetInstanceProcAddr not found");
		return;
	}
	Dl_info info;
	if (dladdr((void *)gipa, &info) != 0 && info.dli_fname != NULL) {
		ovk_copy(r->loaderPath, sizeof r->loaderPath, info.dli_fname);
	}
	ovk_enumerate_instance_version_fn eiv = (ovk_enumerate_instance_version_fn)gipa(NULL, "vkEnumerateInstanceVersion");
	if (eiv == NULL || eiv(&r->instanceVersion) != 0) {
		r->instanceVersion = 0;
	}
	ovk_create_instance_fn create = (ovk_create_instance_fn)gipa(NULL, "vkCreateInstance");
	if (create == NULL) {
		r->failedCall = "vkGetInstanceProcAddr(vkCreateInstance)";
		r->result = -3; // VK_ERROR_INITIALIZATION_FAILED
		return;
	}
	ovk_application_info app = {0};
	app.sType = 0;
	app.pApplicationName = "ortbus vulkan probe";
	app.pEngineName = "ortbus";
	// A 1.0 loader refuses any other version; a newer one takes 1.1, Dawn's minimum.
	app.apiVersion = r->instanceVersion ? OVK_MAKE_API_VERSION(1, 1) : OVK_MAKE_API_VERSION(1, 0);
	ovk_instance_create_info ci = {0};
	ci.sType = 1;
	ci.pApplicationInfo = &app;
	ovk_instance inst = NULL;
	ovk_result res = create(&ci, NULL, &inst);
	if (res != 0 || inst == NULL) {
		r->failedCall = "vkCreateInstance";
		r->result = res;
		return;
	}
	ovk_destroy_instance_fn destroy = (ovk_destroy_instance_fn)gipa(inst, "vkDestroyInstance");
	ovk_enumerate_physical_devices_fn enumerate = (ovk_enumerate_physical_devices_fn)gipa(inst, "vkEnumeratePhysicalDevices");
	ovk_get_physical_device_properties_fn props = (ovk_get_physical_device_properties_fn)gipa(inst, "vkGetPhysicalDeviceProperties");
	// vkGetPhysicalDeviceProperties2 is core in an instance of 1.1 (what this one asks for
	// when the loader is newer than 1.0).
	ovk_get_physical_device_properties2_fn props2 = NULL;
	if (r->instanceVersion >= OVK_MAKE_API_VERSION(1, 1)) {
		props2 = (ovk_get_physical_device_properties2_fn)gipa(inst, "vkGetPhysicalDeviceProperties2");
	}
	if (enumerate == NULL || props == NULL) {
		r->failedCall = "vkGetInstanceProcAddr(vkEnumeratePhysicalDevices)";
		r->result = -3;
	} else {
		uint32_t n = 0;
		res = enumerate(inst, &n, NULL);
		if (res != 0) {
			r->failedCall = "vkEnumeratePhysicalDevices";
			r->result = res;
		} else {
			r->total = n;
			ovk_physical_device pds[OVK_MAX_DEVICES];
			uint32_t m = OVK_MAX_DEVICES;
			res = enumerate(inst, &m, pds);
			if (res != 0 && res != 5) { // 5: VK_INCOMPLETE, more than OVK_MAX_DEVICES
				r->failedCall = "vkEnumeratePhysicalDevices";
				r->result = res;
				m = 0;
			}
			if (m > OVK_MAX_DEVICES) {
				m = OVK_MAX_DEVICES;
			}
			for (uint32_t i = 0; i < m; i++) {
				ovk_properties p;
				memset(&p, 0, sizeof p);
				props(pds[i], &p);
				ovk_device *d = &r->devices[i];
				d->apiVersion = p.head.apiVersion;
				d->driverVersion = p.head.driverVersion;
				d->vendorID = p.head.vendorID;
				d->deviceID = p.head.deviceID;
				d->deviceType = p.head.deviceType;
				ovk_copy_name(d->name, p.head.deviceName, sizeof p.head.deviceName);
				// The driver properties are core in a 1.2 device: only then are they chained.
				if (props2 != NULL && (p.head.apiVersion & 0x1FFFFFFF) >= OVK_MAKE_API_VERSION(1, 2)) {
					ovk_driver_properties dp;
					memset(&dp, 0, sizeof dp);
					dp.sType = 1000196000;
					ovk_properties2 p2;
					memset(&p2, 0, sizeof p2);
					p2.head.sType = 1000059001;
					p2.head.pNext = &dp;
					props2(pds[i], &p2);
					ovk_copy_name(d->driverName, dp.driverName, sizeof dp.driverName);
					ovk_copy_name(d->driverInfo, dp.driverInfo, sizeof dp.driverInfo);
				}
			}
			r->count = m;
		}
	}
	if (destroy != NULL) {
		destroy(inst, NULL);
	}
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"
)

// Loader is the Vulkan loader's library name, dlopen()ed at run time: ortbus has no
// link-time dependency on Vulkan, and a machine without it is a report, not a failure.
const Loader = "libvulkan.so.1"

// LoaderEnv names another library for Probe to dlopen instead of
// Loader. It exists ONLY so that tests can exercise the "no loader" report on a
// machine that has one (a missing library cannot be simulated otherwise without root);
// nothing in a normal configuration sets it, and it does not change which loader ONNX
// Runtime's WebGPU EP (Dawn) uses.
const LoaderEnv = "ORTBUS_VULKAN_LOADER"

// Timeout bounds Probe when its context has no earlier deadline.
const Timeout = 10 * time.Second

// Bounds of what the probe reads: physical devices (in C: OVK_MAX_DEVICES), ICD files
// listed, directory entries read per directory, and the list entries of VK_DRIVER_FILES.
const (
	maxVulkanDevices    = C.OVK_MAX_DEVICES
	maxVulkanICDFiles   = 128
	maxVulkanDirEntries = 1024
	maxVulkanEnvEntries = 64
)

// Report is what Probe found: the loader, the driver (ICD) manifests the
// loader would read, and the physical devices (adapters) it lists. A missing loader, no
// driver, no adapter: each is a report (Problem says which), never a panic.
type Report struct {
	// Loader is the path of the loader library that was loaded (dladdr), or the name
	// dlopen()ed when the path is not known; empty when it could not be loaded.
	Loader string `json:"loader,omitempty"`
	// LoaderErr is dlopen's (or dlsym's) error when the loader could not be loaded.
	LoaderErr string `json:"loader_error,omitempty"`
	// LoaderAPI is the loader's instance version (vkEnumerateInstanceVersion), "1.0"
	// for a loader without it.
	LoaderAPI string `json:"loader_api,omitempty"`
	// ICDSource says where the loader takes its driver list from: VK_DRIVER_FILES or
	// VK_ICD_FILENAMES when set (they replace the search), else "search".
	ICDSource string `json:"icd_source"`
	// ICDSearched are the directories (and, from an environment list, the files) that
	// were looked in, in the loader's order.
	ICDSearched []string `json:"icd_searched"`
	// ICDFiles are the driver manifests (*.json) found there, at most maxVulkanICDFiles.
	ICDFiles []string `json:"icd_files"`
	// ICDMissing are entries of VK_DRIVER_FILES / VK_ICD_FILENAMES that do not exist.
	ICDMissing []string `json:"icd_missing,omitempty"`
	// Adapters are the physical devices the loader lists, in its order (at most 16).
	Adapters []Adapter `json:"adapters"`
	// Err is the failure of a Vulkan call (vkCreateInstance, vkEnumeratePhysicalDevices)
	// or of the probe itself (its time bound).
	Err string `json:"error,omitempty"`
}

// Adapter is one Vulkan physical device.
type Adapter struct {
	Name     string `json:"name"`      // deviceName, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
	Vendor   string `json:"vendor"`    // from VendorID: NVIDIA, AMD, Intel, Mesa, …, else its hex
	VendorID uint32 `json:"vendor_id"` // PCI vendor id, or a Khronos vendor id (Mesa: 0x10005)
	DeviceID uint32 `json:"device_id"`
	Type     string `json:"type"`   // discrete, integrated, virtual, cpu, other
	Driver   string `json:"driver"` // the driver version, decoded per vendor
	API      string `json:"api"`    // the Vulkan version the device supports
	// DriverName and DriverInfo are the driver's own name and version text (Vulkan 1.2's
	// driver properties), e.g. "llvmpipe" and "Mesa 25.0.7-1~bpo12+1 (LLVM 15.0.6)";
	// empty for an older device.
	DriverName string `json:"driver_name,omitempty"`
	DriverInfo string `json:"driver_info,omitempty"`
}

// String is the adapter in one line: vendor, name, type, backend, driver and Vulkan
// versions.
func (a Adapter) String() string {
	return fmt.Sprintf("%s %s (%s, backend Vulkan %s, driver %s)", a.Vendor, a.Name, a.Type, a.API, a.DriverString())
}

// DriverString is the driver as a person reads it: its name and own version text when the
// device gives them, with the decoded driverVersion, e.g. "llvmpipe Mesa 25.0.7 (0.0.1)".
func (a Adapter) DriverString() string {
	if s := strings.TrimSpace(a.DriverName + " " + a.DriverInfo); s != "" {
		return s + " (" + a.Driver + ")"
	}
	return a.Driver
}

// Picked returns the adapter ONNX Runtime's WebGPU EP would get: Dawn sorts adapters for
// a high-performance request as discrete GPU, integrated GPU, CPU, then any other type
// (Vulkan's virtual and other types are Dawn's "unknown"), keeping the loader's order
// among equals (dawn/native/Adapter.cpp, SortAdapters). Dawn may still refuse that device
// (a driver too old for it): only creating the EP tells.
func (r *Report) Picked() (Adapter, bool) {
	i := r.PickedIndex()
	if i < 0 {
		return Adapter{}, false
	}
	return r.Adapters[i], true
}

// PickedIndex is Picked's index in Adapters, -1 when there is no adapter.
func (r *Report) PickedIndex() int {
	if r == nil || len(r.Adapters) == 0 {
		return -1
	}
	best := 0
	for i, a := range r.Adapters {
		if dawnRank(a.Type) < dawnRank(r.Adapters[best].Type) {
			best = i
		}
	}
	return best
}

func dawnRank(typ string) int {
	switch typ {
	case "discrete":
		return 0
	case "integrated":
		return 1
	case "cpu":
		return 2
	}
	return 3
}

// Install advice for a missing Vulkan piece, in Problem's messages.
const (
	vulkanLoaderAdvice = "install the Vulkan loader " + Loader + ": Debian/Ubuntu `apt-get install libvulkan1` (Fedora: vulkan-loader); " +
		"on a machine without a GPU, scripts/install-vulkan.sh (as root) installs it with lavapipe, Mesa's Vulkan on the CPU, from bookworm-backports"
	vulkanDriverAdvice = "install the GPU's Vulkan driver (NVIDIA's driver; Mesa's mesa-vulkan-drivers for AMD and Intel), " +
		"or, without a GPU, scripts/install-vulkan.sh (as root: lavapipe from bookworm-backports)"
)

// Problem says, in one line, what keeps Vulkan from offering an adapter, with what to
// install; it is empty when there is at least one adapter. In order: no loader (the
// library named, the package libvulkan1), no driver manifest (the directories or the
// environment list searched), manifests but no adapter (the manifests listed).
func (r *Report) Problem() string {
	switch {
	case r == nil:
		return "Vulkan was not probed"
	case r.LoaderErr != "":
		return fmt.Sprintf("no Vulkan loader: %s cannot be loaded (%s); %s", or(r.Loader, Loader), r.LoaderErr, vulkanLoaderAdvice)
	case len(r.Adapters) > 0:
		return ""
	case len(r.ICDFiles) == 0:
		msg := fmt.Sprintf("no Vulkan driver (ICD manifest): none in %s", strings.Join(r.ICDSearched, ", "))
		if r.ICDSource != "search" {
			msg = fmt.Sprintf("no Vulkan driver (ICD manifest): %s lists %s", r.ICDSource, strings.Join(r.ICDSearched, ", "))
			if len(r.ICDMissing) > 0 {
				msg += fmt.Sprintf(" (missing: %s)", strings.Join(r.ICDMissing, ", "))
			}
		}
		return msg + "; " + vulkanDriverAdvice
	}
	msg := fmt.Sprintf("Vulkan lists no adapter: none of the drivers %s found a device", strings.Join(r.ICDFiles, ", "))
	if len(r.ICDMissing) > 0 {
		msg += fmt.Sprintf(" (missing: %s)", strings.Join(r.ICDMissing, ", "))
	}
	if r.Err != "" {
		msg += " (" + r.Err + ")"
	}
	return msg + "; " + vulkanDriverAdvice
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// vulkanBusy holds one token while a probe's C call runs: a probe that outlived its
// caller's deadline (a driver hung in vkCreateInstance) keeps it, and later probes report
// that at once instead of piling up threads behind it.
var vulkanBusy = make(chan struct{}, 1)

// Probe loads the Vulkan loader (libvulkan.so.1, or $ORTBUS_VULKAN_LOADER in tests),
// creates a bare Vulkan instance and lists its adapters, as ONNX Runtime's WebGPU EP
// (Dawn over Vulkan) would see them in this process with its environment (VK_DRIVER_FILES
// and the like are read when the instance is created). It also lists the driver manifests
// the loader would consider. It returns within ctx's deadline or Timeout, whichever
// is first: a C call still running then is left to finish on its own thread and the report
// says so. The loader stays loaded for the life of the process (unloading it under a
// runtime that may use it gains nothing). Safe for concurrent use; probes run one at a time.
func Probe(ctx context.Context) *Report {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	name := Loader
	if v := os.Getenv(LoaderEnv); v != "" {
		name = v
	}
	r := &Report{}
	r.ICDSource, r.ICDSearched, r.ICDFiles, r.ICDMissing = vulkanICDs(os.Getenv)
	select {
	case vulkanBusy <- struct{}{}:
	case <-ctx.Done():
		r.Err = "a previous Vulkan probe is still running (a driver hung in vkCreateInstance?)"
		return r
	}
	done := make(chan *C.ovk_report, 1)
	go func() {
		defer func() { <-vulkanBusy }()
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		rep := (*C.ovk_report)(C.malloc(C.sizeof_ovk_report))
		C.ovk_probe(cname, rep)
		done <- rep
	}()
	var rep *C.ovk_report
	select {
	case rep = <-done:
	case <-ctx.Done():
		r.Loader = name
		r.Err = fmt.Sprintf("the Vulkan probe did not finish: %v (a driver hung in vkCreateInstance or vkEnumeratePhysicalDevices?)", ctx.Err())
		go func() { C.free(unsafe.Pointer(<-done)) }()
		return r
	}
	defer C.free(unsafe.Pointer(rep))
	if e := C.GoString(&rep.loaderError[0]); e != "" {
		r.Loader, r.LoaderErr = name, e
		return r
	}
	r.Loader = or(C.GoString(&rep.loaderPath[0]), name)
	r.LoaderAPI = "1.0"
	if v := uint32(rep.instanceVersion); v != 0 {
		r.LoaderAPI = vulkanAPIVersion(v)
	}
	if rep.failedCall != nil {
		r.Err = fmt.Sprintf("%s: %s", C.GoString(rep.failedCall), vkResultName(int32(rep.result)))
	}
	n := min(int(rep.count), maxVulkanDevices)
	for i := range n {
		d := &rep.devices[i]
		vendor := uint32(d.vendorID)
		r.Adapters = append(r.Adapters, Adapter{
			Name:     C.GoString(&d.name[0]),
			Vendor:   Vendor(vendor),
			VendorID: vendor,
			DeviceID: uint32(d.deviceID),
			Type:     vulkanDeviceType(int32(d.deviceType)),
			Driver:   DriverVersion(vendor, uint32(d.driverVersion)),
			API:      vulkanAPIVersion(uint32(d.apiVersion)),

			DriverName: C.GoString(&d.driverName[0]),
			DriverInfo: C.GoString(&d.driverInfo[0]),
		})
	}
	if total := int(rep.total); total > n && r.Err == "" {
		r.Err = fmt.Sprintf("%d adapters, the first %d listed", total, n)
	}
	return r
}

// vulkanICDs returns where the Vulkan loader takes its drivers from, as the loader does
// on Linux (docs/LoaderDriverInterface.md of KhronosGroup/Vulkan-Loader): VK_DRIVER_FILES
// (or the older VK_ICD_FILENAMES), a colon-separated list of manifest files or directories,
// replaces the search; else the search covers $XDG_CONFIG_HOME (~/.config),
// $XDG_CONFIG_DIRS (/etc/xdg), /etc, $XDG_DATA_HOME (~/.local/share) and $XDG_DATA_DIRS
// (/usr/local/share:/usr/share), each + /vulkan/icd.d, plus VK_ADD_DRIVER_FILES first.
// getenv is os.Getenv (a parameter for the tests).
func vulkanICDs(getenv func(string) string) (source string, searched, files, missing []string) {
	seen := map[string]bool{}
	addFile := func(f string) {
		if !seen[f] && len(files) < maxVulkanICDFiles {
			seen[f] = true
			files = append(files, f)
		}
	}
	// fromList reads one environment list: each entry a manifest or a directory of them.
	fromList := func(list string) {
		for i, e := range strings.Split(list, ":") {
			if i >= maxVulkanEnvEntries {
				break
			}
			if e == "" {
				continue
			}
			searched = append(searched, e)
			st, err := os.Stat(e)
			switch {
			case err != nil:
				missing = append(missing, e)
			case st.IsDir():
				for _, f := range jsonFiles(e) {
					addFile(f)
				}
			default:
				addFile(e)
			}
		}
	}
	for _, env := range []string{"VK_DRIVER_FILES", "VK_ICD_FILENAMES"} {
		if v := getenv(env); v != "" {
			fromList(v)
			return env, searched, files, missing
		}
	}
	if v := getenv("VK_ADD_DRIVER_FILES"); v != "" {
		fromList(v)
	}
	home := getenv("HOME")
	xdg := func(env, homeRel, fallback string) []string {
		v := getenv(env)
		if v == "" && homeRel != "" && home != "" {
			v = filepath.Join(home, homeRel)
		}
		if v == "" {
			v = fallback
		}
		return strings.Split(v, ":")
	}
	var dirs []string
	dirs = append(dirs, xdg("XDG_CONFIG_HOME", ".config", "")...)
	dirs = append(dirs, xdg("XDG_CONFIG_DIRS", "", "/etc/xdg")...)
	dirs = append(dirs, "/etc")
	dirs = append(dirs, xdg("XDG_DATA_HOME", ".local/share", "")...)
	dirs = append(dirs, xdg("XDG_DATA_DIRS", "", "/usr/local/share:/usr/share")...)
	for i, d := range dirs {
		if i >= maxVulkanEnvEntries {
			break
		}
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		d = filepath.Join(d, "vulkan", "icd.d")
		if slices.Contains(searched, d) {
			continue
		}
		searched = append(searched, d)
		for _, f := range jsonFiles(d) {
			addFile(f)
		}
	}
	return "search", searched, files, missing
}

// jsonFiles lists dir's *.json entries (not directories), sorted, reading at most
// maxVulkanDirEntries entries.
func jsonFiles(dir string) []string {
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer f.Close()
	ents, err := f.ReadDir(maxVulkanDirEntries)
	if err != nil && !errors.Is(err, io.EOF) && len(ents) == 0 {
		return nil
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".json") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(out)
	return out
}

// Vendor names a Vulkan vendor id: a PCI vendor id, or one of Khronos' own (Mesa's
// software drivers, lavapipe among them, use 0x10005); an unknown one as hex.
func Vendor(id uint32) string {
	switch id {
	case 0x10de:
		return "NVIDIA"
	case 0x1002, 0x1022:
		return "AMD"
	case 0x8086:
		return "Intel"
	case 0x10005:
		return "Mesa"
	case 0x13b5:
		return "ARM"
	case 0x5143:
		return "Qualcomm"
	case 0x1010:
		return "Imagination"
	case 0x106b:
		return "Apple"
	case 0x1ae0:
		return "Google"
	case 0x1af4:
		return "virtio"
	}
	return fmt.Sprintf("0x%x", id)
}

// DriverVersion decodes a driverVersion as vulkaninfo and Dawn do: NVIDIA packs
// major.minor.secondary.tertiary in 10.8.8.6 bits; the others (Mesa, AMD's, Intel's on
// Linux) use Vulkan's major.minor.patch (10.10.12 bits). Intel's Windows scheme does not
// apply on Linux.
func DriverVersion(vendorID, v uint32) string {
	if vendorID == 0x10de {
		return fmt.Sprintf("%d.%d.%d.%d", v>>22, (v>>14)&0xff, (v>>6)&0xff, v&0x3f)
	}
	return fmt.Sprintf("%d.%d.%d", v>>22, (v>>12)&0x3ff, v&0xfff)
}

// vulkanAPIVersion decodes a Vulkan API version (VK_API_VERSION_MAJOR, _MINOR, _PATCH;
// the top three bits are the variant, 0 for Vulkan).
func vulkanAPIVersion(v uint32) string {
	return fmt.Sprintf("%d.%d.%d", (v>>22)&0x7f, (v>>12)&0x3ff, v&0xfff)
}

func vulkanDeviceType(t int32) string {
	switch t {
	case 1:
		return "integrated"
	case 2:
		return "discrete"
	case 3:
		return "virtual"
	case 4:
		return "cpu"
	}
	return "other"
}

func vkResultName(r int32) string {
	names := map[int32]string{
		1: "VK_NOT_READY", 5: "VK_INCOMPLETE",
		-1: "VK_ERROR_OUT_OF_HOST_MEMORY", -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
		-3: "VK_ERROR_INITIALIZATION_FAILED", -4: "VK_ERROR_DEVICE_LOST",
		-6: "VK_ERROR_LAYER_NOT_PRESENT", -7: "VK_ERROR_EXTENSION_NOT_PRESENT",
		-9: "VK_ERROR_INCOMPATIBLE_DRIVER (no usable driver)",
	}
	if n, ok := names[r]; ok {
		return n
	}
	return fmt.Sprintf("VkResult %d", r)
}

// NotTheGPU says why adapter a is not the GPU that device names, or "" when it may be:
// for cuda:N the adapter must be NVIDIA's (vendor 0x10de) and a GPU (discrete or
// integrated); for drm:N and gpu:N, a GPU of any vendor. A CPU adapter (lavapipe's
// llvmpipe, SwiftShader) is never a GPU. pciDevice, when not 0, is the GPU's PCI device id
// (nvidia-smi's pci.device_id >> 16) and must be the adapter's. Any other device (cpu,
// a name ortbus does not know) is not judged.
func NotTheGPU(a Adapter, device string, pciDevice uint32) string {
	kind, _, _ := strings.Cut(device, ":")
	switch kind {
	case "cuda", "drm", "gpu":
	default:
		return ""
	}
	if a.Type != "discrete" && a.Type != "integrated" {
		return fmt.Sprintf("the Vulkan adapter %s is a %s device, not a GPU (device %s)", a, a.Type, device)
	}
	if kind == "cuda" && a.VendorID != 0x10de {
		return fmt.Sprintf("the Vulkan adapter %s is %s's, not NVIDIA's (device %s)", a, a.Vendor, device)
	}
	if pciDevice != 0 && a.DeviceID != pciDevice {
		return fmt.Sprintf("the Vulkan adapter %s has device id 0x%04x, the GPU of %s 0x%04x", a, a.DeviceID, device, pciDevice)
	}
	return ""
}
