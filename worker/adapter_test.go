package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices/vulkan"
	"github.com/ortbus/ortbus/ort"
)

// TestCheckAdapter: a webgpu pool whose adapter is llvmpipe is refused on cuda:0
// (provider_unavailable naming both), served flagged with adapter_mismatch = "flag", and
// served plainly on cpu; a GPU of NVIDIA's serves cuda:0; a pool whose sessions take
// another EP first (cpu, or webgpu not appended) is not judged, and Vulkan is not probed.
func TestCheckAdapter(t *testing.T) {
	llvm := vulkan.Adapter{Name: "llvmpipe (LLVM 15.0.6, 256 bits)", Vendor: "Mesa", VendorID: 0x10005, Type: "cpu"}
	h200 := vulkan.Adapter{Name: "NVIDIA H200", Vendor: "NVIDIA", VendorID: 0x10de, DeviceID: 0x2335, Type: "discrete"}
	var adapters []vulkan.Adapter
	probes := 0
	defer func(p func(context.Context) *vulkan.Report) { probeVulkan = p }(probeVulkan)
	probeVulkan = func(context.Context) *vulkan.Report {
		probes++
		return &vulkan.Report{Adapters: adapters}
	}
	webgpu := ort.SessionConfig{Providers: []ort.Provider{{Name: "webgpu"}, {Name: "cpu"}}}
	cpuFirst := ort.SessionConfig{Providers: []ort.Provider{{Name: "cpu"}, {Name: "webgpu"}}}
	all := func(ort.Provider) error { return nil }
	noWebGPU := func(p ort.Provider) error {
		if p.Name == "webgpu" {
			return errors.New("not built with webgpu")
		}
		return nil
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []struct {
		name     string
		adapters []vulkan.Adapter
		device   string
		mode     string
		sc       ort.SessionConfig
		appends  func(ort.Provider) error
		refused  bool
		adapter  string // a part of the reported adapter; "" = none
		mismatch bool
		probed   bool
	}{
		{"llvmpipe on cuda:0", []vulkan.Adapter{llvm}, "cuda:0", "", webgpu, all, true, "", false, true},
		{"llvmpipe on cuda:0, refuse", []vulkan.Adapter{llvm}, "cuda:0", config.AdapterRefuse, webgpu, all, true, "", false, true},
		{"llvmpipe on cuda:0, flag", []vulkan.Adapter{llvm}, "cuda:0", config.AdapterFlag, webgpu, all, false, "llvmpipe", true, true},
		{"llvmpipe on drm:0", []vulkan.Adapter{llvm}, "drm:0", "", webgpu, all, true, "", false, true},
		{"llvmpipe on cpu", []vulkan.Adapter{llvm}, "cpu", "", webgpu, all, false, "llvmpipe", false, true},
		{"H200 on cuda:0", []vulkan.Adapter{llvm, h200}, "cuda:0", "", webgpu, all, false, "NVIDIA H200", false, true},
		{"no adapter", nil, "cuda:0", "", webgpu, all, false, "", false, true},
		{"cpu first", []vulkan.Adapter{llvm}, "cuda:0", "", cpuFirst, all, false, "", false, false},
		{"webgpu not appended", []vulkan.Adapter{llvm}, "cuda:0", "", webgpu, noWebGPU, false, "", false, false},
	} {
		adapters, probes = c.adapters, 0
		p := &config.Pool{Name: "gpu", EP: "webgpu", Fallback: []string{"cpu"}, Device: c.device, AdapterMismatch: c.mode}
		got, err := checkAdapter(p, c.sc, c.appends, log)
		if c.refused {
			e := codec.AsError(err)
			if err == nil || e.Code != codec.CodeProviderUnavailable || !strings.Contains(e.Message, "llvmpipe") || !strings.Contains(e.Message, c.device) ||
				!strings.Contains(e.Message, `adapter_mismatch = "flag"`) || e.Details["device"] != c.device {
				t.Errorf("%s: %v, want provider_unavailable naming llvmpipe, %s and the option", c.name, err, c.device)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if (c.adapter == "") != (got.adapter == "") || !strings.Contains(got.adapter, c.adapter) || (got.mismatch != "") != c.mismatch {
			t.Errorf("%s: %+v, want adapter %q, mismatch %v", c.name, got, c.adapter, c.mismatch)
		}
		if c.mismatch && !strings.Contains(got.mismatch, "not a GPU") {
			t.Errorf("%s: mismatch %q does not say why", c.name, got.mismatch)
		}
		if (probes > 0) != c.probed {
			t.Errorf("%s: Vulkan probed %d times", c.name, probes)
		}
	}
}
