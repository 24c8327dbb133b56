package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/ortbus/ortbus/config"
)

// CollisionResults are the results of `bench collision`: per class statistics of the same
// arrival schedule run with each class alone (solo), with the gateway's sharing policy
// (policy) and with plain FIFO (fifo).
type CollisionResults struct {
	Scenario *Scenario `json:"scenario"`
	// Counts are the requests of each class in the schedule.
	Counts map[string]int `json:"counts"`
	// Solo maps each class to its statistics when it ran alone (nil when skipped).
	Solo map[string]*ClassStats `json:"solo"`
	// Policy and FIFO map each class to its statistics, plus drain_ms (nil when the run
	// could not be made).
	Policy *CollisionRun   `json:"policy"`
	FIFO   *CollisionRun   `json:"fifo"`
	Ratios CollisionRatios `json:"ratios"`
	// With an LLM tenant ([tenant]): SoloTenant is the tenant alone; Gate is every class
	// and the tenant under the policy with the tenant's lease gated (`ortbus lease
	// --gate`), nil when the scenario asks for no gated run or the ortbus binary's lease
	// has no --gate (a note says so); Policy and FIFO then run the tenant without the gate.
	SoloTenant *TenantStats  `json:"solo_tenant,omitempty"`
	Gate       *CollisionRun `json:"policy_gate,omitempty"`
	// GPU is how a scenario on the GPU ran (gpucollision.go; nil: no pool or lease names
	// the device gpu); SoloGPUMemory the GPU's peak memory in each solo run, by class
	// (and soloTenantKey: the tenant alone).
	GPU           *GPUCollision          `json:"gpu,omitempty"`
	SoloGPUMemory map[string]*MemoryPeak `json:"solo_gpu_memory,omitempty"`
	// Degrade is the degrade run (degrade.go; nil: the scenario has none).
	Degrade *DegradeRun `json:"degrade_run,omitempty"`
	// PolicyKey says whether the gateway took `[gateway] policy` ("ok"), or why not.
	PolicyKey string `json:"policy_key"`
}

// Collision runs the collision scenario: solo runs of each class, then every class at
// once under the sharing policy, then under FIFO, with the same arrival schedule.
func Collision(ctx context.Context, o Options) (*Report, error) {
	h, sc, err := scenarioHarness(&o, "collision", "", func(sc *Scenario) error {
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
	sched := sc.Schedule()
	res := &CollisionResults{Scenario: sc, Counts: scheduleCounts(sc, sched), PolicyKey: "ok"}
	rep.Results = res
	setup, err := h.scenarioSetup(ctx, sc, &res.PolicyKey, "the policy run used its built-in policy, and there is no FIFO run")
	if err != nil {
		return nil, err
	}
	out := o.out()
	fmt.Fprintf(out, "collision: scenario %s, seed %d, window %v; requests: %s\n", sc.Name, sc.Seed, sc.Window.D(), countsLine(sc, res.Counts))
	if res.GPU = setup.gpu; res.GPU != nil {
		if t := setup.tenant; t != nil && t.llama != nil {
			res.GPU.TenantBackend, res.GPU.TenantBackendWhy = t.llama.opts.GPU, t.llama.why
		}
		res.GPU.print(out)
	}
	plain, gated := tenantRuns(out, rep, sc, setup)
	checkOCR := func(run string, r *CollisionRun) { checkOCRSpool(rep, sc, setup, run, r) }

	sys, err := h.startScenario(ctx, "policy", setup.policyCfg, sc, setup)
	if err != nil {
		return nil, err
	}
	sys.runtimes(ctx, &rep.Machine.Runtimes)
	err = policyRuns(ctx, out, &o, sys, sc, sched, setup, plain, gated, res, checkOCR)
	sys.stop()
	if err != nil {
		return nil, err
	}

	if res.PolicyKey == "ok" && !sc.NoFIFO {
		fmt.Fprintf(out, "  fifo ...\n")
		fsys, err := h.startScenario(ctx, "fifo", setup.fifoCfg, sc, setup)
		if err != nil {
			return nil, err
		}
		res.FIFO, err = runSchedule(ctx, fsys, sc, sched, setup.reqs, nil, plain)
		fsys.stop()
		if err != nil {
			return nil, fmt.Errorf("fifo run: %w", err)
		}
		checkOCR("fifo", res.FIFO)
	}
	res.ratios()
	res.print(out, rep)
	if o.Chart != "" {
		if err := writeChart(o.Chart, res); err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
	}
	return rep, nil
}

// policyRuns are the runs on the policy's system: the solo runs (unless o skips them),
// the run with the gated tenant (when there is one), the run without the gate, and the
// degrade run (when the scenario has one: last, since it kills a pool's workers).
func policyRuns(ctx context.Context, out io.Writer, o *Options, sys *system, sc *Scenario, sched []arrival, setup *scenarioSetup, plain, gated *tenantRun,
	res *CollisionResults, checkOCR func(string, *CollisionRun)) error {
	var err error
	if !o.SkipSolo {
		if err := soloRuns(ctx, out, sys, sc, sched, setup, plain, res, checkOCR); err != nil {
			return err
		}
	}
	if gated != nil {
		fmt.Fprintf(out, "  policy, the tenant gated ...\n")
		if res.Gate, err = runSchedule(ctx, sys, sc, sched, setup.reqs, nil, gated); err != nil {
			return fmt.Errorf("policy run with the gate: %w", err)
		}
		checkOCR("policy with the gate", res.Gate)
	}
	fmt.Fprintf(out, "  policy ...\n")
	if res.Policy, err = runSchedule(ctx, sys, sc, sched, setup.reqs, nil, plain); err != nil {
		return fmt.Errorf("policy run: %w", err)
	}
	checkOCR("policy", res.Policy)
	if sc.Degrade != nil {
		fmt.Fprintf(out, "  degrade (pool %s's workers killed mid-run) ...\n", sc.degradeChain()[0])
		if res.Degrade, err = runDegrade(ctx, sys, sc, setup, plain, gated); err != nil {
			return fmt.Errorf("degrade run: %w", err)
		}
		checkOCR("degrade", res.Degrade.Run)
	}
	return nil
}

// scheduleCounts is each class's request count: its arrivals in the schedule, or a
// stream class's frames.
func scheduleCounts(sc *Scenario, sched []arrival) map[string]int {
	counts := map[string]int{}
	for _, a := range sched {
		counts[sc.Classes[a.Class].Name]++
	}
	for _, c := range sc.Classes {
		if c.Arrival == "stream" {
			counts[c.Name] = c.Streams * sc.frames(c)
		}
	}
	return counts
}

// tenantRuns are the LLM tenant's runs without and with the gate (nil: none), said on out;
// a gate the lease wrapper does not have yet is noted.
func tenantRuns(out io.Writer, rep *Report, sc *Scenario, setup *scenarioSetup) (plain, gated *tenantRun) {
	t := setup.tenant
	if t == nil {
		return nil, nil
	}
	p := sc.Tenant
	if t.llama != nil {
		fmt.Fprintf(out, "llm tenant: %d x llama.cpp (tenants/llm/tenant.mjs, -gpu %s) on the generated GGUF %s (%s) under `ortbus lease --device %s --bytes %d --class %s --on-pressure '%s'`: prompts of %d tokens then %d generated, context %d, %d thread(s)\n",
			p.Count, t.llama.opts.GPU, p.Model, filepath.Base(t.llama.opts.Model), p.Device, p.Bytes, p.Class, onPressure, p.Prompt, p.Tokens, p.Context, p.Threads)
	} else {
		spec := p.spec()
		fmt.Fprintf(out, "llm tenant: %d x `ortbus bench llm-tenant` under `ortbus lease --device %s --bytes %d --class %s`: decoder of %d layers, width %d (MLP %d, vocab %d, %.1f M parameters), prompts of %d tokens then %d generated, %d thread(s)\n",
			p.Count, p.Device, p.Bytes, p.Class, spec.Layers, spec.Width, spec.FF, spec.Vocab, float64(spec.Params())/1e6, p.Prompt, p.Tokens, p.Threads)
	}
	plain = t.with(p.Count, false)
	if p.Gate && setup.gate {
		gated = t.with(p.Count, true)
	} else if p.Gate {
		rep.note("no gated run: %s lease has no --gate (the gate is not built yet); the runs with the tenant are without the gate", t.ortbus)
	}
	return plain, gated
}

// checkOCRSpool checks the detector's output files after a run (setup.ocr is set when the
// scenario has the by-path detector): every file whole, then removed.
func checkOCRSpool(rep *Report, sc *Scenario, setup *scenarioSetup, run string, r *CollisionRun) {
	if setup.ocr == nil || r == nil {
		return
	}
	n, err := setup.ocr.checkSpool()
	if err != nil {
		rep.note("%s run: a detector output file is wrong: %v", run, err)
	}
	for _, c := range sc.Classes {
		if s := r.Classes[c.Name]; c.Model == "ocr" && s != nil && s.OK != n {
			rep.note("%s run: %d detector results but %d whole output files", run, s.OK, n)
		}
	}
}

// soloRuns runs each class alone (its part of the schedule) and, with a tenant, the
// tenant alone, into res.Solo and res.SoloTenant.
func soloRuns(ctx context.Context, out io.Writer, sys *system, sc *Scenario, sched []arrival, setup *scenarioSetup, plain *tenantRun, res *CollisionResults, checkOCR func(string, *CollisionRun)) error {
	res.Solo = map[string]*ClassStats{}
	for ci, c := range sc.Classes {
		var only []arrival
		for _, a := range sched {
			if a.Class == ci {
				only = append(only, a)
			}
		}
		active := make([]bool, len(sc.Classes))
		active[ci] = true
		fmt.Fprintf(out, "  solo %s ...\n", c.Name)
		run, err := runSchedule(ctx, sys, sc, only, setup.reqs, active, nil)
		if err != nil {
			return fmt.Errorf("solo %s: %w", c.Name, err)
		}
		checkOCR("solo "+c.Name, run)
		res.Solo[c.Name] = run.Classes[c.Name]
		res.soloMemory(c.Name, run)
	}
	if plain != nil {
		fmt.Fprintf(out, "  solo llm tenant ...\n")
		run, err := runSchedule(ctx, sys, sc, nil, setup.reqs, make([]bool, len(sc.Classes)), plain)
		if err != nil {
			return fmt.Errorf("solo llm tenant: %w", err)
		}
		res.SoloTenant = run.Tenant
		res.soloMemory(soloTenantKey, run)
	}
	return nil
}

// soloTenantKey is the tenant's solo run in CollisionResults.SoloGPUMemory.
const soloTenantKey = "llm_tenant"

// soloMemory records a solo run's GPU memory (when it was watched).
func (r *CollisionResults) soloMemory(key string, run *CollisionRun) {
	if run.GPUMemory == nil {
		return
	}
	if r.SoloGPUMemory == nil {
		r.SoloGPUMemory = map[string]*MemoryPeak{}
	}
	r.SoloGPUMemory[key] = run.GPUMemory
}
