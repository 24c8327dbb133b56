package gateway

import (
	"context"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/subjects"
)

// Changing the configuration without a restart: a reload (SIGHUP, `ortbus reload`:
// ortbus.ops.reload) re-reads the config file; a model operation (`ortbus model
// load|unload|reload`: ortbus.ops.model) changes one pool's models in the configuration
// in force, or replaces the workers that load one model (its files changed). The steps,
// in order:
//
//  1. Read: the next configuration (the file again, or the one in force with one pool's
//     models changed).
//  2. Plan: config.Diff names the pools to start, stop and replace, and why. What a
//     reload cannot change (sections read once at start, the class queues) refuses the
//     whole reload: nothing is applied.
//  3. Admit: the pools to start or replace must fit their devices' memory budget with
//     what is known of their models' peaks (declared memory, or a peak a worker measured)
//     before anything loads; a change that does not fit is refused (overloaded), nothing
//     applied.
//  4. Apply: the next configuration is put in force (requests accepted from now on
//     resolve under it; queued ones are routed under it, a pool or model gone being
//     passed over), then the supervisor starts the added pools, drains and stops the
//     removed ones, and replaces the workers of changed pools one at a time: drained
//     (every request it holds is answered) and stopped, then started on the new
//     configuration. A request a stopped worker held and did not answer is retried (L7).
//  5. Reply: what changed, once every worker started is ready or failed.
//
// Changes run one at a time; a second one meanwhile is answered overloaded. A remote
// pool's workers are not the gateway's to replace: a change to one changes routing only,
// and its operator restarts them.

// reloadTimeout bounds one change's wait for its workers (their model loads).
const reloadTimeout = 10 * time.Minute

// reloadFile re-reads the config file and applies it (a reload).
func (g *Gateway) reloadFile() (*codec.ReloadReply, *codec.Error) {
	cur := g.conf()
	if cur.File == "" {
		return nil, codec.Errorf(codec.CodeBadRequest, "the configuration in force was not read from a file: nothing to reload")
	}
	next, err := config.Load(cur.File)
	if err != nil {
		return nil, codec.Errorf(codec.CodeBadRequest, "reload: %v (the configuration in force is kept)", err)
	}
	ch, err := config.Diff(cur, next)
	if err != nil {
		return nil, codec.Errorf(codec.CodeBadRequest, "reload: %v", err)
	}
	rep, e := g.change(next, ch)
	if e == nil {
		g.fileCfg.Store(next) // the file is the truth again
	}
	return rep, e
}

// unloaded are the models the file gives pool that a run-time unload took from it.
func (g *Gateway) unloaded(pool string) []string {
	file, cur := g.fileCfg.Load(), g.conf()
	fp, cp := file.Pools[pool], cur.Pools[pool]
	if fp == nil || cp == nil {
		return nil
	}
	var out []string
	for _, m := range fp.Models {
		if !slices.Contains(cp.Models, m) {
			out = append(out, m)
		}
	}
	return out
}

// modelControl applies one model operation (ModelControl).
func (g *Gateway) modelControl(mc *codec.ModelControl) (*codec.ReloadReply, *codec.Error) {
	cur := g.conf()
	if cur.Models[mc.Model] == nil {
		return nil, codec.Errorf(codec.CodeUnknownModel, "model %q is not configured ([models])", mc.Model).With("model", mc.Model)
	}
	if mc.Pool != "" && cur.Pools[mc.Pool] == nil {
		return nil, codec.Errorf(codec.CodeUnknownPool, "pool %q is not configured", mc.Pool).With("pool", mc.Pool)
	}
	var pools []string // the pools it concerns
	for _, name := range cur.PoolNames() {
		loads := slices.Contains(cur.Pools[name].Models, mc.Model)
		if (mc.Pool == "" || mc.Pool == name) && (loads || mc.Action == codec.ModelLoad) {
			pools = append(pools, name)
		}
	}
	switch mc.Action {
	case codec.ModelLoad:
		if mc.Pool == "" {
			var local []string
			for _, name := range cur.PoolNames() {
				if cur.Pools[name].IsLocal() {
					local = append(local, name)
				}
			}
			if len(local) != 1 {
				return nil, codec.Errorf(codec.CodeBadRequest, "load %s: name the pool (local pools: %v)", mc.Model, local).With("field", "pool")
			}
			pools = local
		}
		pc := cur.Pools[pools[0]]
		if slices.Contains(pc.Models, mc.Model) {
			return &codec.ReloadReply{Gateway: g.id, Changes: "no change (pool " + pools[0] + " loads " + mc.Model + " already)"}, nil
		}
		return g.changePoolModels(cur, pools[0], append(slices.Clone(pc.Models), mc.Model))
	case codec.ModelUnload:
		if len(pools) == 0 {
			return &codec.ReloadReply{Gateway: g.id, Changes: "no change (no pool loads " + mc.Model + ")"}, nil
		}
		next := cur
		for _, name := range pools {
			var err error
			if next, err = next.WithPoolModels(name, slices.DeleteFunc(slices.Clone(next.Pools[name].Models), func(m string) bool { return m == mc.Model })); err != nil {
				return nil, codec.Errorf(codec.CodeBadRequest, "%v", err)
			}
		}
		ch, err := config.Diff(cur, next)
		if err != nil {
			return nil, codec.Errorf(codec.CodeBadRequest, "%v", err)
		}
		return g.change(next, ch)
	case codec.ModelReload:
		ch := &config.Changes{Changed: map[string]string{}}
		for _, name := range pools {
			ch.Changed[name] = "model " + mc.Model + " reloaded"
		}
		return g.change(cur, ch)
	}
	return nil, codec.Errorf(codec.CodeBadRequest, "action %q: want load, unload or reload", mc.Action).With("field", "action")
}

// changePoolModels applies pool loading models.
func (g *Gateway) changePoolModels(cur *config.Config, pool string, models []string) (*codec.ReloadReply, *codec.Error) {
	next, err := cur.WithPoolModels(pool, models)
	if err != nil {
		return nil, codec.Errorf(codec.CodeBadRequest, "%v", err)
	}
	ch, err := config.Diff(cur, next)
	if err != nil {
		return nil, codec.Errorf(codec.CodeBadRequest, "%v", err)
	}
	return g.change(next, ch)
}

// change admits and applies ch, putting next in force (steps 3 to 5).
func (g *Gateway) change(next *config.Config, ch *config.Changes) (*codec.ReloadReply, *codec.Error) {
	if !g.changing.TryLock() {
		return nil, codec.Errorf(codec.CodeOverloaded, "another configuration change is being applied; try again when it is done")
	}
	defer g.changing.Unlock()
	rep := &codec.ReloadReply{Gateway: g.id, Changes: ch.String(), Added: ch.Added, Removed: ch.Removed, Replaced: ch.Changed, Routing: ch.Routing}
	if ch.Empty() {
		return rep, nil
	}
	if e := g.admitChange(next, ch); e != nil {
		return nil, e
	}
	g.log.Info("applying a configuration change", "changes", rep.Changes)
	cur := g.conf()
	// Heartbeats of both configurations' pools are taken while the change is applied (a
	// removed pool's workers beat while they drain), then only the next one's.
	g.tracker.SetPools(poolSet(cur, next))
	g.cfg.Store(next)
	g.kick()
	ctx, cancel := context.WithTimeout(context.Background(), reloadTimeout)
	defer cancel()
	g.supervisor.apply(ctx, next, ch, g.conf().Gateway.ShutdownGrace.D())
	g.tracker.SetPools(poolSet(next))
	g.kick()
	g.log.Info("configuration change applied", "changes", rep.Changes)
	return rep, nil
}

// poolSet is the pools of the configurations.
func poolSet(cfgs ...*config.Config) map[string]bool {
	out := map[string]bool{}
	for _, c := range cfgs {
		for name := range c.Pools {
			out[name] = true
		}
	}
	return out
}

// admitChange is step 3: on each device, what the pools ch starts or replaces will need
// (each model's declared memory, else the largest peak a live worker measured for it,
// times the pool's workers) must fit the device's budget left, counting the memory of the
// workers being replaced as free. A model of unknown peak counts 0: the worker itself
// refuses it when it loads past its budget, as at start-up.
func (g *Gateway) admitChange(next *config.Config, ch *config.Changes) *codec.Error {
	need := map[string]int64{} // per device
	freed := map[string]int64{}
	prio := map[string]int{}
	for _, name := range append(slices.Clone(ch.Added), slices.Sorted(maps.Keys(ch.Changed))...) {
		pc := next.Pools[name]
		if pc == nil || !pc.IsLocal() || pc.LazyLoad {
			continue
		}
		var n int64
		for _, m := range pc.Models {
			n += g.peakOf(next, m)
		}
		need[pc.Device] += n * int64(max(1, pc.Workers))
		if p, ok := prio[pc.Device]; !ok || next.PoolPriority(name) < p {
			prio[pc.Device] = next.PoolPriority(name)
		}
		for _, w := range g.tracker.Live(name) {
			for _, m := range w.HB.Models {
				freed[pc.Device] += m.PeakBytes
			}
		}
	}
	for device, n := range need {
		if n == 0 {
			continue
		}
		_, _, budget := g.deviceBudget(device)
		if budget <= 0 {
			continue
		}
		leased, _ := g.leases.leased(device)
		left := budget - g.admitted(device, "") + freed[device] - leased - g.foreignBytes(device, leased) - g.reservedAgainst(device, prio[device])
		if n > left {
			return codec.Errorf(codec.CodeOverloaded, "memory admission refused on device %s: the change needs %d MiB, %d MiB of the budget is left (nothing was changed)", device, n>>20, left>>20).
				With("device", device).With("need_bytes", n).With("left_bytes", left)
		}
	}
	return nil
}

// peakOf is what model m is known to need: its declared memory, else the largest peak a
// live worker measured for it (0: unknown).
func (g *Gateway) peakOf(cfg *config.Config, m string) int64 {
	if mc := cfg.Models[m]; mc != nil && mc.Memory > 0 {
		return int64(mc.Memory)
	}
	var peak int64
	for _, w := range g.tracker.Workers() {
		for _, ms := range w.HB.Models {
			if ms.Name == m && ms.State == codec.ModelReady {
				peak = max(peak, ms.PeakBytes)
			}
		}
	}
	return peak
}

// serveOps registers the operators' reload and model endpoints.
func (g *Gateway) serveOps(svc micro.Service) error {
	if err := svc.AddEndpoint("ops-reload", micro.HandlerFunc(func(r micro.Request) {
		g.opsChange(r, "reload", func([]byte, bool) (*codec.ReloadReply, *codec.Error) { return g.reloadFile() })
	}), micro.WithEndpointSubject(subjects.OpsReload)); err != nil {
		return err
	}
	return svc.AddEndpoint("ops-model", micro.HandlerFunc(func(r micro.Request) {
		g.opsChange(r, "model", func(data []byte, asJSON bool) (*codec.ReloadReply, *codec.Error) {
			var mc codec.ModelControl
			if err := codec.Decode(data, &mc, asJSON); err != nil {
				return nil, codec.AsError(err)
			}
			return g.modelControl(&mc)
		})
	}), micro.WithEndpointSubject(subjects.OpsModel))
}

// opsChange answers an operators' change request: checked like any request (reply
// subject, size), applied off the handler (it waits for workers to load), answered once.
func (g *Gateway) opsChange(r micro.Request, what string, apply func([]byte, bool) (*codec.ReloadReply, *codec.Error)) {
	if to := r.Reply(); to == "" || subjects.CheckReply(to, g.conf().NATS.Replies()) != nil {
		g.metrics.bad("reply_subject")
		return
	}
	asJSON := r.Headers().Get(codec.HeaderContentType) == codec.ContentTypeJSON
	data := r.Data()
	var once sync.Once
	respond := func(rep *codec.ReloadReply, e *codec.Error) {
		once.Do(func() {
			var err error
			if e != nil {
				e = boundMessage(e)
				b, _ := codec.Encode(e, asJSON)
				err = r.Error(strconv.Itoa(e.Code.Status()), e.Message, b, jsonHeader(asJSON)...)
			} else {
				b, _ := codec.Encode(rep, asJSON)
				err = r.Respond(b, jsonHeader(asJSON)...)
			}
			if err != nil {
				g.publishFailed("reply", err)
			}
		})
	}
	go func() {
		defer guard.Recover(g.log, "ops "+what, func(e *codec.Error) { respond(nil, e) })
		respond(apply(data, asJSON))
	}()
}

// jsonHeader is the reply option of a JSON reply.
func jsonHeader(asJSON bool) []micro.RespondOpt {
	if !asJSON {
		return nil
	}
	return []micro.RespondOpt{micro.WithHeaders(micro.Headers{codec.HeaderContentType: {codec.ContentTypeJSON}})}
}

// apply puts next in force for the supervisor and starts, stops and replaces the workers
// of the local pools ch names (step 4), returning once each worker it started is ready or
// has failed (or ctx ends). grace bounds a worker's drain before it is killed.
func (s *supervisor) apply(ctx context.Context, next *config.Config, ch *config.Changes, grace time.Duration) {
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
		return
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

// stopProcs asks the running ones of procs to drain and exit (SIGTERM: each answers what
// it holds), kills those still running after grace, and waits for their exits. Their
// exits are no deaths: nothing restarts them.
func (s *supervisor) stopProcs(procs []*proc, grace time.Duration) {
	var running []*proc
	s.mu.Lock()
	for _, p := range procs {
		if p.cmd != nil && p.cmd.Process != nil && !isClosed(p.exited) {
			p.stopping = true
			running = append(running, p)
		}
	}
	s.mu.Unlock()
	for _, p := range running {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(grace)
	for _, p := range running {
		select {
		case <-p.exited:
		case <-deadline:
			for _, q := range running {
				q.cmd.Process.Kill()
			}
			<-p.exited
		}
	}
}
