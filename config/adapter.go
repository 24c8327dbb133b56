package config

import (
	"fmt"
	"slices"
)

// What a webgpu pool's worker does when the Vulkan adapter its sessions would run on is
// not the GPU its device names ([pools.NAME] adapter_mismatch).
const (
	// AdapterRefuse: the worker fails to start (provider_unavailable, naming the adapter
	// and the device): its figures and its memory would be another device's. The default.
	AdapterRefuse = "refuse"
	// AdapterFlag: the worker serves on that adapter, and says so: its heartbeat's
	// adapter_mismatch, status and doctor carry why.
	AdapterFlag = "flag"
)

// UsesWebGPU reports whether webgpu is in the pool's EP chain (ep, then fallback).
func (p *Pool) UsesWebGPU() bool {
	return p.EP == "webgpu" || slices.Contains(p.Fallback, "webgpu")
}

// FlagsAdapterMismatch reports whether a worker of the pool serves on an adapter that is
// not its device's GPU, flagged (adapter_mismatch = "flag"), rather than refusing to start.
func (p *Pool) FlagsAdapterMismatch() bool { return p.AdapterMismatch == AdapterFlag }

// adapterMismatchProblem is why the pool's adapter_mismatch is not valid, or "".
func (p *Pool) adapterMismatchProblem() string {
	switch p.AdapterMismatch {
	case "":
		return ""
	case AdapterRefuse, AdapterFlag:
		if !p.UsesWebGPU() {
			return fmt.Sprintf("%q needs webgpu in the pool's ep or fallback (only a webgpu worker's adapter is checked against its device)", p.AdapterMismatch)
		}
		return ""
	}
	return fmt.Sprintf("want %q or %q, got %q", AdapterRefuse, AdapterFlag, p.AdapterMismatch)
}
