package bench

// bench profile: seed 2's first step — each service of a scenario alone, measured for
// what sharing a machine needs to know of it: p95 latency, throughput, CPU use, idle and
// peak memory (on its device: the GPU's for a pool with a per-process reading there), and
// power. A service is a class of the scenario (the pools of its chain serve it) or its LLM
// tenant. The system, the schedule and the solo runs are the collision bench's
// (scenarioSetup, startScenario, runSchedule): a service runs its part of the schedule
// with nothing else.

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// ProfileResults is `bench profile`'s report.
type ProfileResults struct {
	Scenario string  `json:"scenario"`
	Seed     uint64  `json:"seed"`
	WindowS  float64 `json:"window_s"`
	// GPU is how the scenario's GPU was resolved (nil: it names none); its Smoke is set on
	// a machine without a GPU (lavapipe): then no figure is a GPU's.
	GPU *GPUCollision `json:"gpu,omitempty"`
	// Services are the scenario's classes in order, then its LLM tenant.
	Services []*ServiceProfile `json:"services"`
}

// ServiceProfile is one service measured alone.
type ServiceProfile struct {
	Name string `json:"name"`
	// Kind is "class" or "llm_tenant"; Model the class's model (the tenant's engine's);
	// Pools the pools that serve it (a class's chain), Device and EP its first pool's.
	Kind   string   `json:"kind"`
	Model  string   `json:"model"`
	Pools  []string `json:"pools,omitempty"`
	Device string   `json:"device"`
	EP     string   `json:"ep,omitempty"`
	// Count and OK are its requests and results (the tenant's prompts).
	Count int `json:"count"`
	OK    int `json:"ok"`
	// P95MS is its latency's 95th percentile (the tenant's first token); ItemsPerS its
	// results per second (the tenant's generated tokens per second).
	P95MS     float64 `json:"p95_ms"`
	ItemsPerS float64 `json:"items_per_s"`
	// CPUPercent is the CPU time of its processes (the pools' workers; the tenant's
	// processes) over the run's wall time, 100 = one core busy.
	CPUPercent float64 `json:"cpu_percent"`
	// MemoryIdleBytes is its processes' memory before the run (loaded, idle; the
	// tenant's at its first sample), MemoryPeakBytes the most sampled during it;
	// MemorySource says what was read.
	MemoryIdleBytes int64  `json:"memory_idle_bytes"`
	MemoryPeakBytes int64  `json:"memory_peak_bytes"`
	MemorySource    string `json:"memory_source"`
	MemorySamples   int    `json:"memory_samples"`
	// PowerW is the mean power its device drew during the run (PowerSource says how and
	// of what: the whole device, every process on it), or PowerNote says why there is
	// none.
	PowerW      *float64 `json:"power_w,omitempty"`
	PowerSource string   `json:"power_source,omitempty"`
	PowerNote   string   `json:"power_note,omitempty"`
	// NodesByEP is, by model, where its nodes ran (the workers' heartbeats).
	NodesByEP map[string]map[string]int `json:"nodes_by_ep,omitempty"`
	// Smoke marks a figure that is not a GPU's (SmokeLabel: lavapipe on the CPU).
	Smoke string `json:"smoke,omitempty"`
}

// Profile runs `bench profile`: every service of the scenario (default gpu) alone.
func Profile(ctx context.Context, o Options) (*Report, error) {
	h, sc, err := scenarioHarness(&o, "profile", "gpu", func(sc *Scenario) error {
		if o.Duration > 0 {
			sc.Window = config.Duration(o.Duration)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer h.close()
	rep := h.rep
	res := &ProfileResults{Scenario: sc.Name, Seed: sc.Seed, WindowS: sc.Window.D().Seconds()}
	rep.Results = res
	key := "ok"
	setup, err := h.scenarioSetup(ctx, sc, &key, "the run used the built-in policy")
	if err != nil {
		return nil, err
	}
	out := o.out()
	res.GPU = setup.gpu
	fmt.Fprintf(out, "profile: scenario %s, seed %d, each service alone for a window of %v\n", sc.Name, sc.Seed, sc.Window.D())
	if res.GPU != nil {
		res.GPU.print(out)
	}
	plain, _ := tenantRuns(out, rep, sc, setup)
	sys, err := h.startScenario(ctx, "profile", setup.policyCfg, sc, setup)
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	sys.runtimes(ctx, &rep.Machine.Runtimes)
	st, err := sys.status(ctx)
	if err != nil {
		return nil, err
	}
	sched := sc.Schedule()
	for ci, c := range sc.Classes {
		var only []arrival
		for _, a := range sched {
			if a.Class == ci {
				only = append(only, a)
			}
		}
		active := make([]bool, len(sc.Classes))
		active[ci] = true
		sp := classService(sc, c, st)
		fmt.Fprintf(out, "  %s alone (pools %s) ...\n", c.Name, strings.Join(sp.Pools, ", "))
		pids := workerPIDs(st, sp.Pools)
		run, err := profileRun(ctx, sp, func() []int { return pids }, false, func(ctx context.Context, hooks runHooks) (*CollisionRun, error) {
			return runScheduleWith(ctx, sys, sc, only, setup.reqs, active, nil, hooks)
		})
		if err != nil {
			return nil, fmt.Errorf("profile %s: %w", c.Name, err)
		}
		if cs := run.Classes[c.Name]; cs != nil {
			sp.Count, sp.OK, sp.P95MS, sp.ItemsPerS = cs.Count, cs.OK, cs.P95MS, cs.ThroughputPerS
		}
		res.Services = append(res.Services, sp)
	}
	if plain != nil {
		t := sc.Tenant
		sp := &ServiceProfile{Name: soloTenantKey, Kind: soloTenantKey, Model: t.Model, Device: t.Device}
		fmt.Fprintf(out, "  llm tenant alone ...\n")
		gw := sys.gw.PID()
		run, err := profileRun(ctx, sp, func() []int { return descendants(os.Getpid(), gw) }, true, func(ctx context.Context, hooks runHooks) (*CollisionRun, error) {
			return runScheduleWith(ctx, sys, sc, nil, setup.reqs, make([]bool, len(sc.Classes)), plain, hooks)
		})
		if err != nil {
			return nil, fmt.Errorf("profile llm tenant: %w", err)
		}
		if ts := run.Tenant; ts != nil {
			sp.Count, sp.OK, sp.P95MS, sp.ItemsPerS = ts.Prompts, ts.Prompts, ts.FirstTokenP95MS, ts.TokensPerS
			sp.Model = strings.TrimSpace(t.Model + " " + ts.Engine)
		}
		sp.MemorySource += " (idle: at the run's start, the tenant started and its model loaded, before its prompts)"
		res.Services = append(res.Services, sp)
	}
	if res.GPU != nil && res.GPU.Smoke != "" {
		for _, sp := range res.Services {
			if sp.Device == res.GPU.Device {
				sp.Smoke = res.GPU.Smoke
			}
		}
	}
	res.print(out)
	return rep, nil
}

// classService is class c's service: its chain's pools, the first one's device and EP,
// and where each model's nodes ran on the pools' workers.
func classService(sc *Scenario, c ScenarioClass, st *codec.StatusReply) *ServiceProfile {
	sp := &ServiceProfile{Name: c.Name, Kind: "class", Model: c.Model, Pools: sc.chain(c.Name, c.Model)}
	for _, p := range sc.Pools {
		if len(sp.Pools) > 0 && p.Name == sp.Pools[0] {
			sp.Device, sp.EP = p.Device, orDefault(p.EP, "cpu")
		}
	}
	for _, w := range st.Workers {
		if !slices.Contains(sp.Pools, w.Pool) {
			continue
		}
		for _, m := range w.Models {
			if m.Name == c.Model && len(m.NodesByEP) > 0 {
				if sp.NodesByEP == nil {
					sp.NodesByEP = map[string]map[string]int{}
				}
				sp.NodesByEP[w.Pool] = m.NodesByEP
			}
		}
	}
	return sp
}

// workerPIDs are the pids of pools' workers in a status.
func workerPIDs(st *codec.StatusReply, pools []string) []int {
	var out []int
	for _, w := range st.Workers {
		if slices.Contains(pools, w.Pool) && w.PID > 0 {
			out = append(out, w.PID)
		}
	}
	return out
}

// profileRun runs one service alone (run, with hooks), sampling the processes pids
// names from before it starts until its last answer, and the power of its device, into
// sp. Its idle memory is sampled before the run (a class: its workers loaded), or with
// idleAtStart at the run's start (the tenant: its processes start with the run, and
// the run starts once they are ready).
func profileRun(ctx context.Context, sp *ServiceProfile, pids func() []int, idleAtStart bool, run func(context.Context, runHooks) (*CollisionRun, error)) (*CollisionRun, error) {
	s := newProcSampler(pids, sp.Device)
	var hooks runHooks
	if idleAtStart {
		hooks.during = func(context.Context, time.Time) { s.takeIdle() }
	} else {
		s.takeIdle() // loaded, before the run
	}
	pm := newPowerMeter(sp.Device)
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.run(sctx) }()
	pm.start()
	t0 := time.Now()
	r, err := run(ctx, hooks)
	wall := time.Since(t0)
	stop()
	<-done
	sp.PowerW, sp.PowerNote = pm.stop()
	if sp.PowerW != nil {
		sp.PowerSource = pm.source
	}
	if err != nil {
		return nil, err
	}
	sp.CPUPercent = 100 * s.cpuSeconds() / wall.Seconds()
	sp.MemoryIdleBytes, sp.MemoryPeakBytes, sp.MemorySource, sp.MemorySamples = s.idle, s.peak, s.source, s.samples
	if s.readErr != nil {
		sp.MemorySource += " (a reading failed: " + oneLine(s.readErr.Error()) + ")"
	}
	return r, nil
}

// print writes the services' table.
func (r *ProfileResults) print(out io.Writer) {
	var rows []string
	for _, s := range r.Services {
		power := "-"
		if s.PowerW != nil {
			power = fmt.Sprintf("%.1f", *s.PowerW)
		}
		label := s.Name
		if s.Smoke != "" {
			label += " [" + s.Smoke + "]"
		}
		rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%d/%d\t%.1f\t%.2f\t%.0f\t%.0f\t%.0f\t%s\t", label, orDefault(s.Device, "-"), orDefault(s.EP, "-"),
			s.OK, s.Count, s.P95MS, s.ItemsPerS, s.CPUPercent, mib(s.MemoryIdleBytes), mib(s.MemoryPeakBytes), power))
	}
	printTable(out, "service\tdevice\tep\tok/count\tp95 ms\titems/s\tcpu %\tidle MiB\tpeak MiB\tpower W\t", rows...)
	for _, s := range r.Services {
		fmt.Fprintf(out, "%s: memory from %s", s.Name, s.MemorySource)
		if s.PowerW != nil {
			fmt.Fprintf(out, "; power from %s", s.PowerSource)
		} else {
			fmt.Fprintf(out, "; %s", s.PowerNote)
		}
		fmt.Fprintln(out)
	}
}
