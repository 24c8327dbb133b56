package gateway

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/models/modelrev"
	"github.com/ortbus/ortbus/subjects"
)

// Changing the configuration without a restart: a reload (SIGHUP, `ortbus reload`:
// ortbus.ops.reload) re-reads the config file; a model operation (`ortbus model
// load|unload|reload`: ortbus.ops.model) changes one pool's models in the configuration
// in force, or has the workers that load one model load it again (its files changed).
// The steps, in order:
//
//  1. Read: the next configuration (the file again, or the one in force with one pool's
//     models changed).
//  2. Plan: config.Diff names the pools to start, stop and replace (their own table
//     changed), the pools whose models change in place (loaded, unloaded, reloaded: their
//     workers kept), and why. What a reload cannot change (sections read once at start,
//     the class queues) refuses the whole reload: nothing is applied.
//  3. Admit: what the change loads must fit its devices' memory budget before anything
//     loads (admitChange, its rules numbered there: a model of unknown peak counts the
//     largest peak measured on its device, or its files' size, whichever is larger); a
//     change that does not fit is refused (overloaded), nothing applied.
//  4. Apply: the next configuration is put in force (requests accepted from now on
//     resolve under it; queued ones are routed under it, a pool or model gone being
//     passed over), but for the models loaded in place, which routing learns in step 5.
//     The supervisor's restarts use it from now on (config.PoolModelsEnv), so a worker
//     restarted meanwhile loads the models in force. It starts the added pools, drains and
//     stops the removed ones, and replaces the workers of pools whose table changed one at
//     a time: drained (every request it holds is answered) and stopped, then started on
//     the new configuration. A request a stopped worker held and did not answer is
//     retried (L7). Then the pools whose models change in place are changed by their live
//     workers, one worker at a time (so a pool of several keeps serving): the unload
//     verb for each model unloaded (the worker answers what it accepted for it, then
//     closes it), then the load verb for each model loaded or reloaded, with its table
//     and the device's budget left (a reload swaps a new copy in: no gap), each waited
//     for (its answer, bounded by reloadTimeout, or the worker's exit) and then for the
//     worker's heartbeat that shows it. A model that fails on a worker is failed there,
//     and routed around (a reload's failed copy leaves the old one serving); a worker
//     that does not take the verbs (no responders) is replaced instead.
//  5. In force: the whole next configuration (routing knows the models loaded in place).
//     Reply: what changed, and what failed, once every worker is ready or failed.
//
// Changes run one at a time; a second one meanwhile is answered overloaded. A remote
// pool's workers are not the gateway's to replace or change: a change to one changes
// routing only, and its operator restarts them.

// reloadTimeout bounds one change's wait for its workers (their model loads).
const reloadTimeout = 10 * time.Minute

// reloader owns the configuration: the one in force (cfg: replaced whole by a change,
// never changed in place; every other part reads it through conf, once per decision)
// and the one last read from the file. It turns a reload or a model operation into the
// changes that each owner applies: the tracker its pools, the dispatch loop a pass under
// the new configuration, the supervisor its workers.
type reloader struct {
	*configs
	changing sync.Mutex // one configuration change at a time

	// The owners it hands the changes to, given at construction (Gateway.build).
	id         string
	log        *slog.Logger
	metrics    *metrics
	tracker    *health.Tracker
	supervisor *supervisor
	budget     *memoryBudget
	kick       func()       // a dispatch pass under the configuration now in force
	maxPayload func() int64 // the NATS connection's, for the operators' replies
}

// configs are the configuration in force and the file's: made first, since every concern
// reads the one in force; the reloader changes them.
type configs struct {
	cfg atomic.Pointer[config.Config]
	// fileCfg is the configuration as last read from the file (at start, at each reload):
	// the models a run-time unload took from a pool are its pools' models not in force.
	fileCfg atomic.Pointer[config.Config]
}

// newConfigs holds c as the configuration in force and as the file's.
func newConfigs(c *config.Config) *configs {
	cs := &configs{}
	cs.cfg.Store(c)
	cs.fileCfg.Store(c)
	return cs
}

// conf is the configuration in force.
func (cs *configs) conf() *config.Config { return cs.cfg.Load() }

// reloadOn reloads the config file at each receive on reload (SIGHUP) until ctx ends,
// logging what changed or why nothing did.
func (rl *reloader) reloadOn(ctx context.Context, reload <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
			if rep, e := rl.reloadFile(); e != nil {
				rl.log.Error("reload refused; the configuration in force is kept", "code", e.Code, "err", e.Message)
			} else {
				rl.log.Info("reloaded", "changes", rep.Changes)
			}
		}
	}
}

// reloadFile re-reads the config file and applies it (a reload).
func (rl *reloader) reloadFile() (*codec.ReloadReply, *codec.Error) {
	cur := rl.conf()
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
	rep, e := rl.change(next, ch)
	if e == nil {
		rl.fileCfg.Store(next) // the file is the truth again
	}
	return rep, e
}

// unloaded are the models the file gives pool that a run-time unload took from it (cur:
// the configuration in force).
func (rl *reloader) unloaded(cur *config.Config, pool string) []string {
	file := rl.fileCfg.Load()
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
func (rl *reloader) modelControl(mc *codec.ModelControl) (*codec.ReloadReply, *codec.Error) {
	cur := rl.conf()
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
			return &codec.ReloadReply{Gateway: rl.id, Changes: "no change (pool " + pools[0] + " loads " + mc.Model + " already)"}, nil
		}
		return rl.changePoolModels(cur, pools[0], append(slices.Clone(pc.Models), mc.Model))
	case codec.ModelUnload:
		if len(pools) == 0 {
			return &codec.ReloadReply{Gateway: rl.id, Changes: "no change (no pool loads " + mc.Model + ")"}, nil
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
		return rl.change(next, ch)
	case codec.ModelReload:
		ch := &config.Changes{Models: map[string]config.ModelChanges{}}
		for _, name := range pools {
			ch.Models[name] = config.ModelChanges{Reload: []string{mc.Model}}
		}
		return rl.change(cur, ch)
	}
	return nil, codec.Errorf(codec.CodeBadRequest, "action %q: want load, unload or reload", mc.Action).With("field", "action")
}

// changePoolModels applies pool loading models.
func (rl *reloader) changePoolModels(cur *config.Config, pool string, models []string) (*codec.ReloadReply, *codec.Error) {
	next, err := cur.WithPoolModels(pool, models)
	if err != nil {
		return nil, codec.Errorf(codec.CodeBadRequest, "%v", err)
	}
	ch, err := config.Diff(cur, next)
	if err != nil {
		return nil, codec.Errorf(codec.CodeBadRequest, "%v", err)
	}
	return rl.change(next, ch)
}

// change admits and applies ch, putting next in force (steps 3 to 5).
func (rl *reloader) change(next *config.Config, ch *config.Changes) (*codec.ReloadReply, *codec.Error) {
	if !rl.changing.TryLock() {
		return nil, codec.Errorf(codec.CodeOverloaded, "another configuration change is being applied; try again when it is done")
	}
	defer rl.changing.Unlock()
	rep := &codec.ReloadReply{Gateway: rl.id, Changes: ch.String(), Added: ch.Added, Removed: ch.Removed, Replaced: ch.Changed, Models: ch.InPlace(), Routing: ch.Routing}
	if len(rep.Replaced) == 0 {
		rep.Replaced = nil
	}
	if ch.Empty() {
		return rep, nil
	}
	if e := rl.admitChange(next, ch); e != nil {
		return nil, e
	}
	rl.log.Info("applying a configuration change", "changes", rep.Changes)
	cur := rl.conf()
	// Heartbeats of both configurations' pools are taken while the change is applied (a
	// removed pool's workers beat while they drain), then only the next one's.
	rl.tracker.SetPools(poolSet(cur, next))
	rl.cfg.Store(staged(next, ch))
	rl.kick()
	ctx, cancel := context.WithTimeout(context.Background(), reloadTimeout)
	defer cancel()
	grace := next.Gateway.ShutdownGrace.D()
	targets := rl.supervisor.apply(ctx, next, ch, grace)
	rep.Failed = rl.supervisor.applyInPlace(ctx, next, ch, targets, grace)
	rl.cfg.Store(next)
	rl.tracker.SetPools(poolSet(next))
	rl.kick()
	rl.log.Info("configuration change applied", "changes", rep.Changes, "failed", rep.Failed)
	return rep, nil
}

// staged is next without the models its pools load in place (step 4): routing learns
// them once their workers have them (step 5).
func staged(next *config.Config, ch *config.Changes) *config.Config {
	out := next
	for _, pool := range slices.Sorted(maps.Keys(ch.Models)) {
		load := ch.Models[pool].Load
		if len(load) == 0 || out.Pools[pool] == nil {
			continue
		}
		without := slices.DeleteFunc(slices.Clone(out.Pools[pool].Models), func(m string) bool { return slices.Contains(load, m) })
		if c, err := out.WithPoolModels(pool, without); err == nil {
			out = c
		}
	}
	return out
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

// admitChange is step 3: on each device, what ch will load must fit the budget left
// (budget − admitted − leased − foreign − reserved for higher classes), else the change
// is refused (overloaded) and nothing applied. Its rules:
//
//  1. A pool started (added) or replaced needs the peaks of its models (rule 3) times
//     its workers; the peaks its live workers measured count as freed (they stop first).
//  2. A pool whose models change in place needs, on each live worker, the peaks of the
//     models it loads, and one copy of each model it reloads (the new copy loads beside
//     the old one, on one worker at a time); the peaks its live workers measured for the
//     models it unloads count as freed (unloads run first).
//  3. A model's peak is its declared memory; else the largest peak a live worker measured
//     for it; else, never measured, the larger of the largest peak measured of any model
//     on the device and the size of its files on disk (a model takes at least its
//     weights): a model of unknown peak never counts 0.
//  4. A lazy_load pool asleep, and a remote pool, need nothing now (a sleeping pool is
//     admitted when it wakes; a remote pool's workers are not this gateway's).
//
// A worker still refuses a model whose measured peak passes the budget left for it
// (overloaded, that model alone).
func (rl *reloader) admitChange(next *config.Config, ch *config.Changes) *codec.Error {
	need := map[string]int64{} // per device
	freed := map[string]int64{}
	prio := map[string]int{}
	count := func(pool string, n, f int64) {
		device := next.Pools[pool].Device
		need[device] += n
		freed[device] += f
		if p, ok := prio[device]; !ok || next.PoolPriority(pool) < p {
			prio[device] = next.PoolPriority(pool)
		}
	}
	for _, name := range append(slices.Clone(ch.Added), slices.Sorted(maps.Keys(ch.Changed))...) { // rule 1
		pc := next.Pools[name]
		if pc == nil || !pc.IsLocal() || pc.LazyLoad { // rule 4
			continue
		}
		var n, f int64
		for _, m := range pc.Models {
			n += rl.peakOf(next, pc.Device, m)
		}
		for _, w := range rl.tracker.Live(name) {
			for _, m := range w.HB.Models {
				f += m.PeakBytes
			}
		}
		count(name, n*int64(max(1, pc.Workers)), f)
	}
	for _, name := range slices.Sorted(maps.Keys(ch.Models)) { // rule 2
		pc, mch := next.Pools[name], ch.Models[name]
		if pc == nil || !pc.IsLocal() {
			continue
		}
		live := rl.tracker.Live(name) // none when asleep (rule 4)
		var n, f int64
		for _, m := range mch.Load {
			n += rl.peakOf(next, pc.Device, m) * int64(len(live))
		}
		if len(live) > 0 {
			for _, m := range mch.Reload {
				n += rl.peakOf(next, pc.Device, m)
			}
		}
		for _, w := range live {
			for _, m := range w.HB.Models {
				if slices.Contains(mch.Unload, m.Name) {
					f += m.PeakBytes
				}
			}
		}
		count(name, n, f)
	}
	cur := rl.conf() // the budgets are the configuration's in force, read once
	for device, n := range need {
		if n == 0 {
			continue
		}
		left, ok := rl.budget.left(cur, device, "", prio[device])
		if !ok {
			continue
		}
		left += freed[device]
		if n > left {
			return codec.Errorf(codec.CodeOverloaded, "memory admission refused on device %s: the change needs %d MiB, %d MiB of the budget is left (nothing was changed)", device, n>>20, left>>20).
				With("device", device).With("need_bytes", n).With("left_bytes", left)
		}
	}
	return nil
}

// peakOf is what model m is known to need on device (admitChange, rule 3).
func (rl *reloader) peakOf(cfg *config.Config, device, m string) int64 {
	mc := cfg.Models[m]
	if mc != nil && mc.Memory > 0 {
		return int64(mc.Memory)
	}
	var peak, onDevice int64
	for _, w := range rl.tracker.Workers() {
		if w.Dead {
			continue
		}
		here := cfg.Pools[w.HB.Pool] != nil && cfg.Pools[w.HB.Pool].Device == device
		for _, ms := range w.HB.Models {
			if ms.State != codec.ModelReady {
				continue
			}
			if ms.Name == m {
				peak = max(peak, ms.PeakBytes)
			}
			if here {
				onDevice = max(onDevice, ms.PeakBytes)
			}
		}
	}
	if peak > 0 {
		return peak
	}
	return max(onDevice, filesSize(mc))
}

// filesSize is the size on disk of model mc's files (modelrev.Files), 0 when unknown.
func filesSize(mc *config.Model) int64 {
	if mc == nil {
		return 0
	}
	files, err := modelrev.Files(mc)
	if err != nil {
		return 0
	}
	var n int64
	for _, f := range files {
		if st, err := os.Stat(f.Path); err == nil {
			n += st.Size()
		}
	}
	return n
}

// serveOps registers the operators' reload and model endpoints.
func (rl *reloader) serve(svc micro.Service) error {
	if err := svc.AddEndpoint("ops-reload", micro.HandlerFunc(func(r micro.Request) {
		rl.opsChange(r, "reload", func([]byte, bool) (*codec.ReloadReply, *codec.Error) { return rl.reloadFile() })
	}), micro.WithEndpointSubject(subjects.OpsReload)); err != nil {
		return err
	}
	return svc.AddEndpoint("ops-model", micro.HandlerFunc(func(r micro.Request) {
		rl.opsChange(r, "model", func(data []byte, asJSON bool) (*codec.ReloadReply, *codec.Error) {
			var mc codec.ModelControl
			if err := codec.Decode(data, &mc, asJSON); err != nil {
				return nil, codec.AsError(err)
			}
			return rl.modelControl(&mc)
		})
	}), micro.WithEndpointSubject(subjects.OpsModel))
}

// opsChange answers an operators' change request: checked like any request (reply
// subject, size), applied off the handler (it waits for workers to load), answered once.
func (rl *reloader) opsChange(r micro.Request, what string, apply func([]byte, bool) (*codec.ReloadReply, *codec.Error)) {
	if to := r.Reply(); to == "" || subjects.CheckReply(to, rl.conf().NATS.Replies()) != nil {
		rl.metrics.bad("reply_subject")
		return
	}
	asJSON := r.Headers().Get(codec.HeaderContentType) == codec.ContentTypeJSON
	data := r.Data()
	var once sync.Once
	respond := func(rep *codec.ReloadReply, e *codec.Error) {
		once.Do(func() {
			var body []byte
			if e == nil {
				body, _ = codec.Encode(rep, asJSON)
			}
			if err := respond(r, asJSON, body, e, rl.maxPayload()); err != nil {
				rl.metrics.publishFailed("reply", err)
			}
		})
	}
	go func() {
		defer guard.Recover(rl.log, "ops "+what, func(e *codec.Error) { respond(nil, e) })
		respond(apply(data, asJSON))
	}()
}
