package worker

import (
	"context"
	"log/slog"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices/vulkan"
	"github.com/ortbus/ortbus/ort"
)

// adapterCheck is what a worker knows of the Vulkan adapter its webgpu sessions run on:
// the adapter (Adapter.String), and, when it is not the GPU the pool's device names and
// the pool serves all the same (adapter_mismatch = "flag"), why (the heartbeat's
// adapter_mismatch). Both "" for a worker whose sessions do not run webgpu.
type adapterCheck struct {
	adapter, mismatch string
}

// probeVulkan is vulkan.Probe (a test's fake).
var probeVulkan = vulkan.Probe

// checkAdapter checks, for a pool whose sessions will run the webgpu EP (the first EP of
// sc's chain that the runtime appends — appends: nil for another), the adapter Dawn
// takes (vulkan.Probe in this process, with the pool's environment) against the GPU the
// pool's device names (vulkan.NotTheGPU: llvmpipe is no GPU, cuda:N must be NVIDIA's). A
// mismatch is refused (provider_unavailable, naming the adapter and the device: the
// worker does not start) unless the pool says adapter_mismatch = "flag": then it is
// logged and carried in the heartbeat. Without any adapter there is nothing to judge:
// the sessions fail on webgpu and follow the chain, as without the check.
func checkAdapter(p *config.Pool, sc ort.SessionConfig, appends func(ort.Provider) error, log *slog.Logger) (adapterCheck, error) {
	webgpu := false
	for _, prov := range sc.Providers {
		if appends(prov) == nil {
			webgpu = prov.Name == "webgpu"
			break
		}
	}
	if !webgpu {
		return adapterCheck{}, nil
	}
	a, ok := probeVulkan(context.Background()).Picked()
	if !ok {
		return adapterCheck{}, nil
	}
	c := adapterCheck{adapter: a.String()}
	why := vulkan.NotTheGPU(a, p.Device, 0)
	switch {
	case why == "":
		return c, nil
	case p.FlagsAdapterMismatch():
		c.mismatch = why
		log.Warn("serving on a Vulkan adapter that is not the pool's device (adapter_mismatch = \"flag\")", "device", p.Device, "adapter", c.adapter, "why", why)
		return c, nil
	}
	return c, codec.Errorf(codec.CodeProviderUnavailable, "pool %s names device %s, but its webgpu sessions would run on %s: %s (set adapter_mismatch = %q to serve on it, flagged)",
		p.Name, p.Device, a.Name, why, config.AdapterFlag).
		With("pool", p.Name).With("ep", "webgpu").With("device", p.Device).With("adapter", a.Name)
}
