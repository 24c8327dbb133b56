package bench

// The schedule runner, shared by collision, capacity, scenario and degrade: one run of a
// scenario's arrival schedule (Scenario.Schedule) on a started system — the scheduled
// requests at their times, the flood classes' floods, the stream classes' streams and the
// LLM tenants — waiting for every answer, then each class's statistics (runstats.go).

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
)

// runSchedule runs one collision: the schedule's requests sent at their times, each
// stream class's audio streams (stream.go) and each flood class's flood (inflight
// requests outstanding, each answer followed by a new request, from the class's start
// until the end of the window), for the classes active marks (nil: all), and the LLM
// tenants of tenants (nil: none; tenantrun.go) from the plan's start to the window's end.
// It waits for every answer (up to the scenario's drain timeout after the window) and
// computes each class's statistics.
func runSchedule(ctx context.Context, sys *system, sc *Scenario, sched []arrival, reqs []func() codec.Request, active []bool, tenants *tenantRun) (*CollisionRun, error) {
	return runScheduleWith(ctx, sys, sc, sched, reqs, active, tenants, runHooks{})
}

// runHooks are what a run may do beside its load (the degrade run, degrade.go).
type runHooks struct {
	// during, when set, runs in a goroutine of its own from the run's start; the run
	// waits for it to return before its statistics (ctx ends at the run's end).
	during func(ctx context.Context, start time.Time)
	// done, when set, gets every call and stream frame of the run once it is over.
	done func(calls []call, frames [][]frameRec, start time.Time)
}

// runScheduleWith is runSchedule with hooks; with the system's GPU memory watch set
// (sys.gpuMem) it also samples the device's memory from before the tenants start until
// every answer is in (CollisionRun.GPUMemory).
func runScheduleWith(ctx context.Context, sys *system, sc *Scenario, sched []arrival, reqs []func() codec.Request, active []bool, tenants *tenantRun, hooks runHooks) (*CollisionRun, error) {
	on := func(ci int) bool { return active == nil || active[ci] }
	cl, err := newCaller(sys.nc)
	if err != nil {
		return nil, err
	}
	defer cl.close()
	stopMem := sys.gpuMem.start()
	defer stopMem() // a run that fails: the watch stops all the same (a second stop is a no-op)
	var tp runningTenants
	if tenants != nil && tenants.n > 0 {
		if tp, err = tenants.start(ctx, sys.ready.NATSURL, sc.Window.D()); err != nil {
			return nil, fmt.Errorf("llm tenant: %w", err)
		}
		defer tp.kill() // after finish, nothing is left to stop
	}
	start := time.Now().Add(50 * time.Millisecond)
	windowEnd := start.Add(sc.Window.D())
	if tp != nil {
		begin := time.AfterFunc(time.Until(start.Add(tenants.plan.Start.D())), tp.begin)
		defer begin.Stop()
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()

	floods := floodTokens(sc, on, cl)
	var wg, hook sync.WaitGroup
	hctx, endHook := context.WithCancel(rctx)
	defer endHook()
	if hooks.during != nil {
		hook.Go(func() { hooks.during(hctx, start) })
	}
	frames := make([][]frameRec, len(sc.Classes))
	for ci, c := range sc.Classes {
		if !on(ci) {
			continue
		}
		switch c.Arrival {
		case "flood":
			wg.Go(func() { runFlood(rctx, cl, c, reqs[ci], floods[c.Name], start, windowEnd) })
		case "stream":
			wg.Go(func() {
				frames[ci] = runStreams(rctx, sys.cl, c, sc.Seed, c.Streams, sc.frames(c), start)
			})
		}
	}
	fail := func(err error) (*CollisionRun, error) {
		cancel()
		wg.Wait()
		hook.Wait()
		return nil, err
	}
	if err := sendSchedule(ctx, cl, sc, sched, reqs, start, windowEnd); err != nil {
		return fail(err)
	}
	var tenantStats *TenantStats
	if tp != nil {
		if tenantStats, err = tp.finish(); err != nil {
			return fail(fmt.Errorf("llm tenant: %w", err))
		}
	}
	endHook() // the window is over: a hook's work ends
	hook.Wait()
	wg.Wait() // the streams' last answers; no flood sends after the window
	cl.wait(ctx, sc.DrainTimeout.D())
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	calls := cl.snapshot()
	if hooks.done != nil {
		hooks.done(calls, frames, start)
	}
	run := collisionRun(sc, calls, frames, start, windowEnd)
	run.Tenant, run.GPUMemory = tenantStats, stopMem()
	time.Sleep(300 * time.Millisecond) // let the system settle before the next run
	return run, nil
}

// floodTokens are the flood classes' tokens (of those on): a token per request that may
// be outstanding, given back by its answer.
func floodTokens(sc *Scenario, on func(ci int) bool, cl *caller) map[string]chan struct{} {
	floods := map[string]chan struct{}{}
	for ci, c := range sc.Classes {
		if c.Arrival == "flood" && on(ci) {
			floods[c.Name] = make(chan struct{}, c.InFlight)
			for range c.InFlight {
				floods[c.Name] <- struct{}{}
			}
		}
	}
	if len(floods) > 0 {
		cl.setOnReply(func(k *call) {
			if ch, ok := floods[k.Class]; ok {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		})
	}
	return floods
}

// runFlood is a flood class's sender: from the class's start to the window's end, a new
// request for each token (one given back by each answer).
func runFlood(ctx context.Context, cl *caller, c ScenarioClass, req func() codec.Request, tokens chan struct{}, start, windowEnd time.Time) {
	from := time.NewTimer(time.Until(start.Add(c.Start.D())))
	defer from.Stop()
	select {
	case <-ctx.Done():
		return
	case <-from.C:
	}
	end := time.NewTimer(time.Until(windowEnd))
	defer end.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-end.C:
			return
		case <-tokens:
			r := req()
			r.ID = nuid.Next()
			cl.send(c.Op, &r) // a failed publish is recorded on its call
		}
	}
}

// sendSchedule sends the schedule's requests at their times, then waits for the end of
// the window.
func sendSchedule(ctx context.Context, cl *caller, sc *Scenario, sched []arrival, reqs []func() codec.Request, start, windowEnd time.Time) error {
	for _, a := range sched {
		if err := sleepUntil(ctx, start.Add(a.At)); err != nil {
			return err
		}
		req := reqs[a.Class]()
		req.ID = nuid.Next()
		if _, err := cl.send(sc.Classes[a.Class].Op, &req); err != nil {
			return err
		}
	}
	return sleepUntil(ctx, windowEnd)
}

// sleepUntil waits until t (no wait when it is past), or returns ctx's error.
func sleepUntil(ctx context.Context, t time.Time) error {
	if d := time.Until(t); d > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	return nil
}
