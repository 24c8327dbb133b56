package bench

// The collision on one GPU (issue 32; scenarios/collision-gpu.toml): a scenario's pools,
// its LLM tenant's lease and its [devices] capacity may name the device "gpu"
// (GPUDevice), which is the GPU this machine has (findGPU: cuda:0 for NVIDIA, drm:N) or,
// without one, LogicalGPU: a device of the config whose capacity the scenario declares
// ([devices] gpu) and whose webgpu pools run on the Vulkan device there is (lavapipe,
// Mesa's Vulkan on the CPU). The run is then a smoke, marked SmokeLabel, whose targets
// are not judged: lavapipe is the CPU, not a GPU. With a GPU the capacity is the
// driver's, and each run's peak memory is read from it (gpumem.go).

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices"
)

const (
	// GPUDevice is the device name a scenario gives the GPU.
	GPUDevice = "gpu"
	// LogicalGPU is what GPUDevice is on a machine without a GPU.
	LogicalGPU = "gpu:0"
)

// GPUCollision is how a scenario on the GPU ran: the results' "gpu".
type GPUCollision struct {
	// GPU is what the machine's GPU check found; Device what GPUDevice became.
	GPU    GPU    `json:"gpu"`
	Device string `json:"device"`
	// Adapter is the Vulkan device Dawn takes for the webgpu pools ("" without one).
	Adapter string `json:"adapter,omitempty"`
	// Smoke is SmokeLabel without a GPU: no target is judged.
	Smoke string `json:"smoke,omitempty"`
	// CapacityBytes and CapacitySource are the device's memory and where the figure
	// comes from; BudgetBytes is it x SafeFraction, what the gateway admits peaks and
	// leases against.
	CapacityBytes  int64   `json:"capacity_bytes"`
	CapacitySource string  `json:"capacity_source"`
	SafeFraction   float64 `json:"safe_fraction"`
	BudgetBytes    int64   `json:"budget_bytes"`
	// MemoryReading is where the runs' peaks are read (nvidia-smi, DRM sysfs), or
	// NoMemoryReading.
	MemoryReading string `json:"memory_reading"`
	// TenantBackend is the llama tenant's -gpu and TenantBackendWhy why ("" without a
	// llama tenant).
	TenantBackend    string `json:"tenant_backend,omitempty"`
	TenantBackendWhy string `json:"tenant_backend_why,omitempty"`
	// MemoryChecks are, for each run's system, its workers' device_bytes against the
	// device's own growth (memcheck.go).
	MemoryChecks []*MemCheck `json:"memory_checks,omitempty"`
}

// checkMemory checks the memory of run's workers on the GPU, loaded, against the
// device's growth since before (read before the run's system started; beforeErr: it
// could not be): a sum off by more than 10% is a target missed, a check that could not
// be made a note that it was not measured (on a real GPU; a smoke judges nothing).
func (g *GPUCollision) checkMemory(ctx context.Context, rep *Report, run string, sys *system, before DeviceReading, beforeErr error) {
	m := &MemCheck{Run: run, Device: g.Device, Verdict: "not measured: " + NoMemoryReading}
	if g.MemoryReading != NoMemoryReading {
		m = checkSystem(ctx, run, g.Device, sys, before, beforeErr)
	}
	g.MemoryChecks = append(g.MemoryChecks, m)
	if g.Smoke == "" {
		m.judge(rep)
	}
}

// usesGPU reports whether a pool or the tenant's lease names GPUDevice.
func (s *Scenario) usesGPU() bool {
	for _, p := range s.Pools {
		if p.Device == GPUDevice {
			return true
		}
	}
	return s.Tenant != nil && s.Tenant.Device == GPUDevice
}

// usesWebGPU reports whether a pool runs the webgpu EP.
func (s *Scenario) usesWebGPU() bool {
	for _, p := range s.Pools {
		if p.EP == "webgpu" {
			return true
		}
	}
	return false
}

// resolveGPU names device wherever the scenario says GPUDevice (pools, the tenant), and
// keeps the capacity [devices] gpu declares for it only when told (the logical GPU, or a
// GPU whose driver gives none): a GPU's capacity is its driver's.
func (s *Scenario) resolveGPU(device string, keepDeclared bool) {
	for i := range s.Pools {
		if s.Pools[i].Device == GPUDevice {
			s.Pools[i].Device = device
		}
	}
	if s.Tenant != nil && s.Tenant.Device == GPUDevice {
		s.Tenant.Device = device
	}
	if b, ok := s.Devices[GPUDevice]; ok {
		delete(s.Devices, GPUDevice)
		if keepDeclared {
			s.Devices[device] = b
		}
	}
}

// flagLogicalGPU marks the webgpu pools on GPUDevice adapter_mismatch = "flag": on a
// machine without a GPU they run on the logical one (LogicalGPU) on lavapipe, which is no
// GPU, a smoke said so (SmokeLabel); their workers would refuse it otherwise.
func (s *Scenario) flagLogicalGPU() {
	for i := range s.Pools {
		if s.Pools[i].Device == GPUDevice && s.Pools[i].EP == "webgpu" {
			s.Pools[i].AdapterMismatch = config.AdapterFlag
		}
	}
}

// prepareGPU finds the GPU of a scenario that names one (nil, nil when it does not),
// resolves GPUDevice in sc, checks Vulkan and sets the environment Dawn wants when a pool
// runs webgpu, and reads the device's capacity and whether its memory can be read.
func (h *harness) prepareGPU(ctx context.Context, sc *Scenario) (*GPUCollision, error) {
	if !sc.usesGPU() {
		return nil, nil
	}
	g := &GPUCollision{GPU: detectGPU(), SafeFraction: config.DefaultSafeFraction}
	if sc.usesWebGPU() {
		_, pick, err := probeAdapter(ctx)
		if err != nil {
			return nil, fmt.Errorf("bench: the scenario's webgpu pools need a Vulkan device: %w", err)
		}
		g.Adapter = pick.String()
		if err := g.GPU.checkAdapter(pick); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		restore, err := webgpuEnv(h.w.dir)
		if err != nil {
			return nil, err
		}
		h.undo = append(h.undo, restore)
		h.o.startBound = webgpuStartBound
	}
	g.Device = g.GPU.Device
	declared, hasDeclared := sc.Devices[GPUDevice]
	keepDeclared := false
	if g.Device == "" {
		if !hasDeclared {
			return nil, fmt.Errorf("bench: no GPU here (%s), and the scenario declares no capacity for its logical one ([devices] gpu = SIZE)", g.GPU.What)
		}
		g.Device, g.Smoke, keepDeclared = LogicalGPU, SmokeLabel, true
		sc.flagLogicalGPU()
		g.CapacityBytes, g.CapacitySource = int64(declared), "declared ([devices] gpu): no GPU here"
		h.rep.note("%s: no GPU here (%s); the webgpu pools run on %s, the device %s a logical one", SmokeLabel, g.GPU.What, orDefault(g.Adapter, "no Vulkan device"), LogicalGPU)
	} else if capacity, source, err := devices.Capacity(g.Device); err == nil {
		g.CapacityBytes, g.CapacitySource = capacity, source
	} else if hasDeclared {
		// A GPU whose driver publishes no memory size (devices.Capacity): the declared one.
		g.CapacityBytes, g.CapacitySource, keepDeclared = int64(declared), "declared ([devices] gpu): "+oneLine(err.Error()), true
	} else {
		return nil, fmt.Errorf("bench: the capacity of %s: %w (declare it: [devices] gpu = SIZE)", g.Device, err)
	}
	g.BudgetBytes = int64(float64(g.CapacityBytes) * g.SafeFraction)
	g.MemoryReading = NoMemoryReading
	if _, ok := devices.Used(g.Device); ok {
		g.MemoryReading = usedSource(g.Device)
	}
	sc.resolveGPU(g.Device, keepDeclared)
	return g, nil
}

// usedSource names where devices.Used reads a device's used memory.
func usedSource(device string) string {
	if strings.HasPrefix(device, "cuda:") {
		return "nvidia-smi (memory.used)"
	}
	return "DRM sysfs (mem_info_vram_used)"
}

// watch is the memory watch of the GPU's runs (its reader nil without a reading).
func (g *GPUCollision) watch() *memWatch {
	w := &memWatch{reading: g.MemoryReading, budget: g.BudgetBytes, every: memEvery}
	if g.MemoryReading != NoMemoryReading {
		dev := g.Device
		w.read = func() (int64, bool) { return devices.Used(dev) }
	}
	return w
}

// print says what the GPU is, what the pools and the tenant run on, and the budget.
func (g *GPUCollision) print(out io.Writer) {
	if g.Smoke != "" {
		fmt.Fprintf(out, "gpu: none here (%s): %s — the webgpu pools on the logical device %s (declared %.0f MiB), Vulkan adapter %s\n",
			g.GPU.What, strings.ToUpper(g.Smoke), g.Device, mib(g.CapacityBytes), orDefault(g.Adapter, "-"))
	} else {
		fmt.Fprintf(out, "gpu: %s, device %s, Vulkan adapter %s\n", g.GPU.What, g.Device, orDefault(g.Adapter, "-"))
	}
	fmt.Fprintf(out, "gpu memory budget: %.0f MiB (capacity %.0f MiB from %s x %.2f); peaks read by: %s\n",
		mib(g.BudgetBytes), mib(g.CapacityBytes), g.CapacitySource, g.SafeFraction, g.MemoryReading)
	if g.TenantBackend != "" {
		fmt.Fprintf(out, "llm tenant backend: -gpu %s (%s)\n", g.TenantBackend, g.TenantBackendWhy)
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// printGPUMemory prints each run's peak memory against the budget and, on a GPU with a
// reading, judges the runs with and without the gate (peak within the budget).
func (r *CollisionResults) printGPUMemory(out io.Writer, rep *Report) {
	g := r.GPU
	var rows []string
	add := func(name string, m *MemoryPeak) {
		if m == nil {
			return
		}
		if m.Samples == 0 {
			rows = append(rows, fmt.Sprintf("%s\t%s\t-\t-\t%.0f\t-\t-\t", name, m.Reading, mib(m.BudgetBytes)))
			return
		}
		rows = append(rows, fmt.Sprintf("%s\t%s\t%d\t%.0f\t%.0f\t%.3f\t%s\t", name, m.Reading, m.Samples, mib(m.PeakUsedBytes), mib(m.BudgetBytes), m.PeakOfBudget, verdict(m.Within())))
	}
	for _, c := range r.Scenario.Classes {
		add("solo "+c.Name, r.SoloGPUMemory[c.Name])
	}
	add("solo llm tenant", r.SoloGPUMemory[soloTenantKey])
	for _, run := range []struct {
		name string
		r    *CollisionRun
	}{{"gate", r.Gate}, {"policy (no gate)", r.Policy}, {"fifo", r.FIFO}} {
		if run.r != nil {
			add(run.name, run.r.GPUMemory)
		}
	}
	if r.Degrade != nil && r.Degrade.Run != nil {
		add("degrade", r.Degrade.Run.GPUMemory)
	}
	printTable(out, "run\tgpu memory reading\tsamples\tpeak MiB\tbudget MiB\tpeak/budget\twithin\t", rows...)
	if g.Smoke != "" || g.MemoryReading == NoMemoryReading {
		fmt.Fprintf(out, "gpu peak memory vs the %.0f%% budget: %s\n", 100*g.SafeFraction, NoMemoryReading)
		return
	}
	for _, run := range []struct {
		name string
		r    *CollisionRun
	}{{"with the gate", r.Gate}, {"without the gate", r.Policy}} {
		if run.r == nil || run.r.GPUMemory == nil {
			continue
		}
		m := run.r.GPUMemory
		ok := rep.target(m.Within(), "%s, the GPU's peak memory %.0f MiB is over its %.0f MiB budget", run.name, mib(m.PeakUsedBytes), mib(m.BudgetBytes))
		fmt.Fprintf(out, "%s: gpu peak %.0f MiB of the %.0f MiB budget (target within: %s)\n", run.name, mib(m.PeakUsedBytes), mib(m.BudgetBytes), verdict(ok))
	}
}
