package bench

// The harness every bench shares, in three parts:
//
//	starting   harness (the runtime library, the temporary directory, the report) and its
//	           startSystem / scenarioSetup / startScenario: a gateway with its embedded
//	           NATS server and its workers, from a config the harness writes and checks
//	measuring  timeInterleaved (latency, one call at a time, paths interleaved in blocks),
//	           countFor (calls counted over a phase), asyncLoad (requests kept in flight on
//	           a caller), summarize and pct (percentiles, bench.go), perSecond (rates)
//	reporting  printTable (a tab-aligned table), Report.target (a target's verdict and its
//	           note), verdict (bench.go)

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// harness is one bench run's shared state: its options (resolved), the ONNX Runtime
// library its workers and in-process baselines load, its temporary directory and its
// report.
type harness struct {
	o   *Options
	lib string
	w   *workdir
	rep *Report
	// undo are what close undoes (the environment a webgpu run set).
	undo []func()
}

// newHarness finds the runtime library, makes the temporary directory with the generated
// models (the heavy tagger with heavyLayers compute layers, 0 = none) and starts the
// report of the bench called name. o must be resolved. close undoes it.
func newHarness(o *Options, name string, heavyLayers int) (*harness, error) {
	lib, err := o.runtimeLib(RuntimeVersion)
	if err != nil {
		return nil, err
	}
	w, err := newWorkdir(o, heavyLayers)
	if err != nil {
		return nil, err
	}
	return &harness{o: o, lib: lib, w: w, rep: newReport(name)}, nil
}

// scenarioHarness resolves o, loads its scenario (def when o names none), lets adjust
// apply the bench's options to it, replaces its seed with o's when set, and starts the
// harness of the bench called name with the scenario's heavy tagger.
func scenarioHarness(o *Options, name, def string, adjust func(*Scenario) error) (*harness, *Scenario, error) {
	if err := o.resolve(); err != nil {
		return nil, nil, err
	}
	if o.Scenario == "" {
		o.Scenario = def
	}
	sc, err := LoadScenario(o.Scenario)
	if err != nil {
		return nil, nil, err
	}
	if err := adjust(sc); err != nil {
		return nil, nil, err
	}
	if o.Seed != 0 {
		sc.Seed = o.Seed
	}
	h, err := newHarness(o, name, sc.HeavyLayers)
	if err != nil {
		return nil, nil, err
	}
	return h, sc, nil
}

// close records the end of the bench, undoes what the bench set in the environment
// (webgpuEnv) and removes the temporary directory.
func (h *harness) close() {
	h.rep.finish()
	for _, f := range h.undo {
		f()
	}
	h.w.close()
}

// startSystem writes c as the config name.toml (checked by the bench's gateway binary),
// starts a system on it and records its workers' runtime versions in the report.
func (h *harness) startSystem(ctx context.Context, name string, c sysConfig) (*system, error) {
	cfg, err := h.w.writeConfig(h.o, name, c)
	if err != nil {
		return nil, err
	}
	sys, err := startSystem(ctx, h.o, h.w, name, cfg)
	if err != nil {
		return nil, err
	}
	sys.runtimes(ctx, &h.rep.Machine.Runtimes)
	return sys, nil
}

// scenarioSetup is what the collision and capacity benches start their runs from.
type scenarioSetup struct {
	// reqs is how each class of the scenario makes a request; ocr is the by-path
	// detector, nil when no class uses it (see scenarioRequests).
	reqs []func() codec.Request
	ocr  *ocrPath
	// policyCfg and fifoCfg are the configs of the policy and FIFO runs (fifoCfg is ""
	// when the gateway took no policy key).
	policyCfg, fifoCfg string
	// tenant is the scenario's LLM tenant (nil: none; tenantrun.go), gate whether the
	// ortbus binary's lease has --gate.
	tenant *tenantRun
	gate   bool
	// gpu is the scenario's GPU (nil: no pool or tenant names the device "gpu";
	// gpucollision.go).
	gpu *GPUCollision
}

// scenarioSetup fetches the models a scenario loads and writes the configs of its runs.
// When the gateway takes no policy key, *policyKey says why and the report notes it,
// ending with without (what the bench does without the key).
func (h *harness) scenarioSetup(ctx context.Context, sc *Scenario, policyKey *string, without string) (*scenarioSetup, error) {
	gpu, err := h.prepareGPU(ctx, sc)
	if err != nil {
		return nil, err
	}
	reqs, ocr, err := scenarioRequests(h.o, sc, h.w)
	if err != nil {
		return nil, err
	}
	policy, fifo, refused, err := h.w.runConfigs(h.o, collisionConfig(sc, h.w, h.lib))
	if err != nil {
		return nil, err
	}
	if refused != "" {
		*policyKey = "refused: " + refused
		h.rep.note("the gateway's config has no [gateway] policy key yet (%s): %s", refused, without)
	}
	tenant, gate, err := tenantSetup(h.o, h.w, h.lib, sc, gpu)
	if err != nil {
		return nil, err
	}
	return &scenarioSetup{reqs: reqs, ocr: ocr, policyCfg: policy, fifoCfg: fifo, tenant: tenant, gate: gate, gpu: gpu}, nil
}

// startScenario starts a system on cfg (one of s's configs) and warms it up with the
// scenario's requests; on a GPU its workers' memory is checked against the device's own
// count (memcheck.go) once they are loaded.
func (h *harness) startScenario(ctx context.Context, name, cfg string, sc *Scenario, s *scenarioSetup) (*system, error) {
	var before DeviceReading
	var beforeErr error
	if s.gpu != nil {
		before, beforeErr = readDevice(s.gpu.Device)
	}
	sys, err := startScenario(ctx, h.o, h.w, name, cfg, sc, s.reqs)
	if err == nil && s.gpu != nil {
		sys.gpuMem = s.gpu.watch()
		s.gpu.checkMemory(ctx, h.rep, name, sys, before, beforeErr)
	}
	return sys, err
}

// positiveOr is v, or def when v is not positive (an option's default).
func positiveOr[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// timedPath is one path of a latency measurement: f is one call, timed alone.
type timedPath struct {
	name string
	f    func() error
	ds   []time.Duration
}

// timeInterleaved calls each path warmup times (not timed), then times n calls of each,
// one at a time, in blocks of block calls a path in turn, so that a drift of the
// machine's state affects every path alike. It returns each path's percentiles.
func timeInterleaved(ctx context.Context, paths []timedPath, warmup, n, block int) ([]Summary, error) {
	for i := range paths {
		for j := 0; j < warmup; j++ {
			if err := paths[i].f(); err != nil {
				return nil, fmt.Errorf("warm-up of %s: %w", paths[i].name, err)
			}
		}
	}
	for done := 0; done < n; done += block {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for i := range paths {
			for j := 0; j < min(block, n-done); j++ {
				t0 := time.Now()
				if err := paths[i].f(); err != nil {
					return nil, fmt.Errorf("%s: %w", paths[i].name, err)
				}
				paths[i].ds = append(paths[i].ds, time.Since(t0))
			}
		}
	}
	out := make([]Summary, len(paths))
	for i := range paths {
		out[i] = summarize(paths[i].ds)
	}
	return out, nil
}

// countFor calls one for warm (not counted), then counts its calls until phase has
// passed; it returns the count and the time they took.
func countFor(ctx context.Context, warm, phase time.Duration, one func() error) (int, time.Duration, error) {
	for t0 := time.Now(); time.Since(t0) < warm; {
		if err := one(); err != nil {
			return 0, 0, err
		}
	}
	n, t0 := 0, time.Now()
	for time.Since(t0) < phase {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		if err := one(); err != nil {
			return 0, 0, err
		}
		n++
	}
	return n, time.Since(t0), nil
}

// perSecond is the rate of n in d, to two places (0 when d is not positive).
func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return round(float64(n)/d.Seconds(), 2)
}

// asyncLoad keeps up to a number of requests outstanding: each send takes a slot, and
// the caller's reply handler gives it back (release).
type asyncLoad struct {
	slots chan struct{}
	stop  atomic.Bool
	wg    sync.WaitGroup
	err   error
}

func newAsyncLoad(inflight int) *asyncLoad {
	return &asyncLoad{slots: make(chan struct{}, inflight)}
}

// release gives back the slot of an answered request.
func (l *asyncLoad) release() { <-l.slots }

// run sends, from a goroutine of its own, a request (send) whenever a slot is free, until
// halt or ctx's end or a send's error (halt returns it).
func (l *asyncLoad) run(ctx context.Context, send func() error) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for !l.stop.Load() && ctx.Err() == nil {
			select {
			case l.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			if l.stop.Load() {
				<-l.slots
				return
			}
			if err := send(); err != nil {
				l.err = err
				return
			}
		}
	}()
}

// halt stops the load and waits for its goroutine; it returns the error of a send.
func (l *asyncLoad) halt() error {
	l.stop.Store(true)
	l.wg.Wait()
	return l.err
}

// printTable prints a tab-aligned table on out: head, then rows, each a line of cells
// each ended by a tab.
func printTable(out io.Writer, head string, rows ...string) {
	tw := table(out)
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		fmt.Fprintln(tw, r)
	}
	tw.Flush()
}

// target records, when ok is false, the note "target missed: " + format; it returns ok.
func (r *Report) target(ok bool, format string, args ...any) bool {
	if !ok {
		r.note("target missed: "+format, args...)
	}
	return ok
}
