package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/subjects"
)

// The supervisor's part of a configuration change (reload.go, step 4): the next
// configuration put in force for its restarts, the local pools it names started, stopped
// and replaced (apply), and the models of the pools that change in place changed on their
// live workers (applyInPlace), over the bus (its request, wired to the gateway's NATS
// connection), with the verbs signed by its control key.

// inPlaceTarget is a worker process whose models change in place: a running process of
// a pool of ch.Models when apply put next in force (so one started with the models before
// it), by its id then.
type inPlaceTarget struct {
	p  *proc
	id string
}

// apply puts next in force for the supervisor and starts, stops and replaces the workers
// of the local pools ch names (step 4), returning once each worker it started is ready or
// has failed (or ctx ends). grace bounds a worker's drain before it is killed. The pools
// whose models change in place get next's table (a worker restarted from now on loads the
// models in force), their skipped models that they no longer load or reload tried
// afresh; apply returns their running processes, whose models the gateway changes.
func (s *supervisor) apply(ctx context.Context, next *config.Config, ch *config.Changes, grace time.Duration) map[string][]inPlaceTarget {
	cur := s.conf()
	s.cfg.Store(next)
	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	targets := map[string][]inPlaceTarget{}
	for _, name := range slices.Sorted(maps.Keys(ch.Models)) {
		pp, pc := s.pools[name], next.Pools[name]
		if pp == nil || pc == nil || !pc.IsLocal() {
			continue
		}
		pp.cfg = pc
		for m := range pp.skip {
			if !slices.Contains(pc.Models, m) || slices.Contains(ch.Models[name].Reload, m) {
				delete(pp.skip, m)
			}
		}
		if pp.asleep {
			continue // its next start reads the new configuration
		}
		for _, p := range pp.procs {
			if p.cmd != nil && p.cmd.Process != nil && !isClosed(p.exited) && !p.stopping {
				targets[name] = append(targets[name], inPlaceTarget{p: p, id: p.id})
			}
		}
	}
	for _, name := range ch.Removed {
		if pp := s.pools[name]; pp != nil {
			delete(s.pools, name)
			procs := slices.Clone(pp.procs)
			run(func() { s.drain(procs, grace) })
		}
	}
	for _, name := range ch.Added {
		pc := next.Pools[name]
		if !pc.IsLocal() {
			continue
		}
		pp := &poolProcs{cfg: pc, asleep: pc.LazyLoad}
		for i := 0; i < pc.Workers; i++ {
			pp.procs = append(pp.procs, &proc{pool: name, slot: i})
		}
		s.pools[name] = pp
		if !pp.asleep {
			procs := slices.Clone(pp.procs)
			run(func() { s.startAll(ctx, procs) })
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ch.Changed)) {
		pp := s.pools[name]
		pc := next.Pools[name]
		if pp == nil || pc == nil || !pc.IsLocal() {
			continue
		}
		pp.cfg = pc
		for m := range pp.skip {
			// A skipped model whose table changed, or that the pool no longer loads, is
			// tried afresh: the crash was the old one's.
			if !slices.Contains(pc.Models, m) || !sameModel(cur, next, m) {
				delete(pp.skip, m)
			}
		}
		pp.failed, pp.crashLooping, pp.deaths = nil, false, nil // the new configuration may fix them
		if pp.asleep {
			continue // its next start reads the new configuration
		}
		procs := slices.Clone(pp.procs)
		run(func() {
			for _, p := range procs {
				if ctx.Err() != nil {
					return
				}
				s.replace(ctx, p, grace)
			}
		})
	}
	s.mu.Unlock()
	wg.Wait()
	return targets
}

// applyInPlace changes the models of the pools of ch.Models on their workers (step 4):
// targets (apply's), the pools in parallel, the workers of a pool one at a time. It
// returns what failed, one line each.
func (s *supervisor) applyInPlace(ctx context.Context, next *config.Config, ch *config.Changes, targets map[string][]inPlaceTarget, grace time.Duration) []string {
	var mu sync.Mutex
	var failed []string
	var wg sync.WaitGroup
	for _, pool := range slices.Sorted(maps.Keys(targets)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, t := range targets[pool] {
				lines := s.changeWorker(ctx, next, pool, ch.Models[pool], t, grace)
				mu.Lock()
				failed = append(failed, lines...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(failed)
	return failed
}

// changeWorker changes the models of one worker of pool in place (step 4): it waits for
// a starting one to settle, unloads, then loads and reloads, in next's order. A worker
// that is gone, or was restarted meanwhile (it loaded the models in force), is left
// alone. It returns what failed, one line each.
func (s *supervisor) changeWorker(ctx context.Context, next *config.Config, pool string, mch config.ModelChanges, t inPlaceTarget, grace time.Duration) []string {
	s.waitSettled(ctx, t.p)
	var failed []string
	fail := func(format string, args ...any) {
		failed = append(failed, "worker "+t.id+": "+fmt.Sprintf(format, args...))
	}
	pc := next.Pools[pool]
	var verbs []struct {
		verb, model string
	}
	for _, m := range mch.Unload {
		verbs = append(verbs, struct{ verb, model string }{subjects.VerbUnload, m})
	}
	for _, m := range pc.Models {
		if slices.Contains(mch.Load, m) || slices.Contains(mch.Reload, m) {
			verbs = append(verbs, struct{ verb, model string }{subjects.VerbLoad, m})
		}
	}
	for _, v := range verbs {
		exited, ok := s.current(t, v.verb == subjects.VerbLoad, v.model)
		if !ok {
			return failed // gone or restarted: its process loads the models in force
		}
		e := s.modelVerb(ctx, next, pool, t.id, v.verb, v.model, exited)
		answered := time.Now()
		if v.verb == subjects.VerbLoad {
			s.loaded(t, v.model)
		}
		switch {
		case e == nil:
			s.waitModelBeat(t.id, v.model, v.verb == subjects.VerbUnload, answered)
		case e.Code == codec.CodeNoWorker && e.Details["replace"] == true:
			// It takes no load or unload verb (an older worker, or NATS permissions that
			// do not let it hear them): replaced, its new process loads the models in force.
			s.log.Warn("a worker does not take the model verbs; replacing it", "worker", t.id, "pool", pool)
			fail("replaced: %s", e.Message)
			s.replace(ctx, t.p, grace)
			return failed
		case e.Code == codec.CodeWorkerLost:
			fail("%s", e.Message)
			return failed
		case v.verb == subjects.VerbUnload && e.Code == codec.CodeUnknownModel:
			// It does not have the model (a failed start, a skipped model): nothing to do.
		default:
			fail("model %s: %s: %s", v.model, e.Code, e.Message)
			if v.verb == subjects.VerbLoad {
				s.waitModelBeat(t.id, v.model, false, answered)
			}
		}
	}
	return failed
}

// modelVerb sends verb (load or unload) for model to worker id and waits for its answer:
// nil (the model's status), or the worker's error. exited closes when the worker's
// process exits (worker_lost: no answer will come). A worker that takes no such verb is
// no_worker with details.replace.
func (s *supervisor) modelVerb(ctx context.Context, next *config.Config, pool, id, verb, model string, exited <-chan struct{}) *codec.Error {
	subj, err := subjects.Worker(id, verb)
	if err != nil {
		return codec.Errorf(codec.CodeInternal, "%v", err)
	}
	key, sent := codec.WorkerKey(s.controlKey, id), s.controlSent()
	var body any
	if verb == subjects.VerbLoad {
		table, err := config.MarshalModel(next.Models[model])
		if err != nil {
			return codec.Errorf(codec.CodeInternal, "%v", err)
		}
		load := &codec.WorkerLoad{Model: model, Table: string(table), Order: next.Pools[pool].Models}
		if left, ok := s.mem.remaining(next.Pools[pool].Device, pool, ""); ok {
			load.BudgetBytes = max(left, 1) // 0 would be no limit: none left fails the model
		}
		load.Sign(key, id, sent)
		body = load
	} else {
		unload := &codec.WorkerUnload{Model: model}
		unload.Sign(key, id, sent)
		body = unload
	}
	data, err := codec.Marshal(body)
	if err != nil {
		return codec.Errorf(codec.CodeInternal, "%v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-rctx.Done():
		}
	}()
	s.log.Info("changing a model in place", "worker", id, "verb", verb, "model", model)
	m, err := s.request(rctx, subj, data)
	gone := false
	select {
	case <-exited:
		gone = true
	default:
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return codec.Errorf(codec.CodeNoWorker, "worker %s does not take the %s verb", id, verb).With("replace", true)
	case err != nil && gone:
		return codec.Errorf(codec.CodeWorkerLost, "exited during %s %s: its restart loads the models in force", verb, model)
	case err != nil:
		return codec.Errorf(codec.CodeWorkerLost, "no answer to %s %s: %v", verb, model, err)
	}
	if e := reply.ErrorOf(m); e != nil {
		return e
	}
	var st codec.ModelStatus
	if err := codec.Unmarshal(m.Data, &st); err != nil || st.Name != model {
		return codec.Errorf(codec.CodeInternal, "%s %s: the worker's answer is not the model's status", verb, model)
	}
	return nil
}

// waitModelBeat waits (a bounded time) until the tracker has heard a heartbeat of worker
// id sent after the worker's answer (at answered) that shows model settled — ready or
// failed after a load, gone after an unload — so that the next worker's budget counts
// its memory and routing sees its state when the change is in force.
func (s *supervisor) waitModelBeat(id, model string, gone bool, answered time.Time) {
	awaitBeat(s.tracker, id, 3*s.conf().Health.HeartbeatInterval.D(), func(w health.Worker, ok bool) bool {
		if !ok || w.Dead {
			return true
		}
		if w.HB.SentMS < answered.UnixMilli() {
			return false // a beat from before the answer
		}
		listed, settled := false, false
		for _, m := range w.HB.Models {
			if m.Name == model {
				listed, settled = true, m.State == codec.ModelReady || m.State == codec.ModelFailed
			}
		}
		return gone && !listed || !gone && settled
	})
}

// current reports whether t's process is the one apply found, still running and ready,
// with its exit channel; when load, it marks model as the one the process is loading, so
// that a native crash in the load skips the model on its restarts (as a "loading" event
// line does at start-up).
func (s *supervisor) current(t inPlaceTarget, load bool, model string) (<-chan struct{}, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := t.p
	if p.id != t.id || !p.ready || p.stopping || isClosed(p.exited) {
		return nil, false
	}
	if load {
		p.loading = model
	}
	return p.exited, true
}

// loaded clears the model t's process was loading in place (current).
func (s *supervisor) loaded(t inPlaceTarget, model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.p.id == t.id && t.p.loading == model {
		t.p.loading = ""
	}
}

// sameModel reports whether model m has the same table in a and b.
func sameModel(a, b *config.Config, m string) bool {
	ma, mb := a.Models[m], b.Models[m]
	return ma != nil && mb != nil && reflect.DeepEqual(ma, mb)
}

// startAll starts procs one after another (their budgets follow each other's heartbeats,
// as at start-up), each waited for until ready or failed.
func (s *supervisor) startAll(ctx context.Context, procs []*proc) {
	for _, p := range procs {
		if ctx.Err() != nil {
			return
		}
		s.spawn(p)
		s.waitSettled(ctx, p)
		s.waitHeartbeat(p)
	}
}

// waitSettled waits until p is ready or has failed (or ctx ends).
func (s *supervisor) waitSettled(ctx context.Context, p *proc) {
	s.mu.Lock()
	settled := p.settled
	s.mu.Unlock()
	if settled == nil {
		return
	}
	select {
	case <-settled:
	case <-ctx.Done():
	}
}

// replace drains and stops p's process (not a death: no restart of its own), then
// starts its slot's next generation and waits for it.
func (s *supervisor) replace(ctx context.Context, p *proc, grace time.Duration) {
	s.stopProcs([]*proc{p}, grace)
	s.mu.Lock()
	old := p.id
	p.gen++
	s.mu.Unlock()
	if old != "" {
		s.tracker.Forget(old)
	}
	s.spawn(p)
	s.waitSettled(ctx, p)
	s.waitHeartbeat(p)
}

// drain stops procs of a removed pool and forgets their ids.
func (s *supervisor) drain(procs []*proc, grace time.Duration) {
	s.stopProcs(procs, grace)
	s.mu.Lock()
	for _, p := range procs {
		if s.byID[p.id] == p {
			delete(s.byID, p.id)
		}
	}
	s.mu.Unlock()
	for _, p := range procs {
		if p.id != "" {
			s.tracker.Forget(p.id) // marked dead at its exit (its requests answered): gone now
		}
	}
}
