package gateway

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/sched"
	"github.com/ortbus/ortbus/subjects"
)

// opsOfKind are the ops each model kind serves (config.Kinds, the table the worker's
// models package loads by).
var opsOfKind = func() map[string][]string {
	m := map[string][]string{}
	for _, k := range config.Kinds {
		m[k.Name] = k.Ops
	}
	return m
}()

// poolsFor keeps the pools of a chain that load a model serving op (the named model, if
// one is named), in chain order, as cfg has them.
func poolsFor(cfg *config.Config, chain []string, op, model string) []string {
	var out []string
	for _, name := range chain {
		if poolServes(cfg, name, op, model) {
			out = append(out, name)
		}
	}
	return out
}

// serves reports whether pool, as cfg has it, loads a model serving op (model, if named).
// A pool cfg does not have serves nothing.
func poolServes(cfg *config.Config, pool, op, model string) bool {
	for _, m := range cfg.Pool(pool).Models {
		if mc := cfg.Models[m]; mc != nil && (model == "" || m == model) && slices.Contains(opsOfKind[mc.Kind], op) {
			return true
		}
	}
	return false
}

// mapPaths checks that the request's paths (path, out_path, and infer's input_paths,
// output_dir and output_paths) can be expressed on every candidate pool's host (pools may
// map path prefixes between hosts).
func mapPaths(cfg *config.Config, p *pending, pools []string) *codec.Error {
	for _, pool := range pools {
		r := p.req
		if field, path, ok := mapRequest(cfg.Pool(pool).PathMap, &r); !ok {
			return codec.Errorf(codec.CodeForbiddenPath, "%s %s is not under any prefix that pool %s maps", field, path, pool).With("pool", pool)
		}
	}
	return nil
}

// route decides an item of a dispatch pass: the first candidate pool, in order, that is
// not reserved by higher-priority waiting work and has room. An item waits while some
// candidate pool can still come (live but full, or its workers starting); it fails with
// no_worker, naming every pool and why it was skipped, when none can.
func (c *capacity) place(it *sched.Item, reserved map[string]bool) decision {
	p := it.Value.(*pending)
	pools := c.inForce(it, p)
	if len(pools) == 0 {
		return decision{err: codec.Errorf(codec.CodeUnknownModel, "no pool of %v serves op %s%s any more (the configuration was reloaded)", it.Pools, p.op, modelSuffix(p.req.Model))}
	}
	if d, ok := c.first(it, p, pools, reserved); ok {
		return d
	}
	return c.waiting(it, p, pools)
}

// inForce is the item's pools as the configuration in force has them: a reload
// (reload.go) may have removed a pool, or the model from a pool, since the item was
// accepted.
func (c *capacity) inForce(it *sched.Item, p *pending) []string {
	pools := it.Pools // the common case: all of them, no copy
	for i, pool := range it.Pools {
		if c.pools[pool] == nil || !poolServes(c.cfg, pool, p.op, p.req.Model) {
			pools = slices.Clone(it.Pools[:i])
			for _, q := range it.Pools[i+1:] {
				if c.pools[q] != nil && poolServes(c.cfg, q, p.op, p.req.Model) {
					pools = append(pools, q)
				}
			}
			break
		}
	}
	return pools
}

// first sends the item to the first pool of its chain with room for it now (ok), or
// decides that it cannot finish in time anywhere, or that it waits for the chain's first
// live pool a moment; not ok: no pool takes it in this pass (waiting says why).
func (c *capacity) first(it *sched.Item, p *pending, pools []string, reserved map[string]bool) (decision, bool) {
	infeasible := 0
	earlierLive := false // a pool before this one in the chain has live workers
	busyEarlier := false // a live pool before this one was busy (not infeasible)
	spill := c.maySpill(p)
	for _, pool := range pools {
		if c.modelDown(pool, p.req.Model) != nil {
			continue // it cannot serve the model: as if it were not in the chain
		}
		if c.pausedOn(it.Class, pool, p) {
			continue // paused on its device (pause.go, rule 1): it waits below
		}
		if busyEarlier && !spill {
			return decision{}, true // wait for the chain's first live pool a moment (maySpill)
		}
		key := pool + "\x00" + it.Class
		// A bump (pick.go, rule 4) commits the item to a busy worker: only in the first
		// live pool of its chain, never past a live pool that is about to free a slot
		// (with replies straight to the client, a client's next request can come before
		// the gateway has heard that the last one is done).
		bump := !earlierLive
		earlierLive = earlierLive || c.pools[pool].live
		if reserved[pool] || c.full[key] {
			busyEarlier = busyEarlier || c.pools[pool].live
			continue
		}
		room := c.hasRoom(pool, it.Class, reserved) || (bump && c.bumps(pool, it.Class) > 0)
		if !room || !c.shareAllows(pool, it.Class, reserved) {
			if room || bump {
				// Full for this class for the rest of the pass: later items skip it cheaply.
				c.full[key] = true
			}
			busyEarlier = busyEarlier || c.pools[pool].live
			continue
		}
		if !c.feasible(estKey{pool, p.op, p.req.Model}, it.Class, it.Deadline) {
			infeasible++
			continue
		}
		c.take(pool, it.Class)
		return decision{pool: pool, worker: c.pickWorker(pool, it.Class, p.req.Model, c.prefetch(pool, it.Class, reserved) > 0)}, true
	}
	if infeasible > 0 && infeasible == len(pools) {
		return decision{err: codec.Errorf(codec.CodeDeadlineExceeded, "cannot finish before its deadline on any of %v even if run now (measured service time)", pools)}, true
	}
	return decision{}, false
}

// waiting decides for an item that no pool of its chain takes now: it waits (for a busy,
// paused or coming pool, or its owner's resume), wakes a lazy pool, or fails with why no
// pool can run it.
func (c *capacity) waiting(it *sched.Item, p *pending, pools []string) decision {
	// The pools its owner's own pause holds it from are out of its chain while it waits,
	// and it waits for them rather than fail (pause.go, rule 5).
	own := c.ownPaused(it.Class, pools, p)
	var why []string
	var down []*codec.Error
	for _, pool := range pools {
		pc := c.pools[pool]
		if own[pool] {
			continue
		}
		if c.pausedOn(it.Class, pool, p) && c.modelDown(pool, p.req.Model) == nil {
			return decision{own: own} // paused (pause.go, rule 1): it waits, and wakes no pool
		}
		if e := c.modelDown(pool, p.req.Model); e != nil {
			down = append(down, e)
			why = append(why, fmt.Sprintf("%s: %s", pool, e.Message))
			continue
		}
		switch {
		case pc.live:
			return decision{own: own} // busy: wait
		case pc.asleep:
			// A lazy_load pool starts on its first request: the item waits for it, and the
			// rest of the pass does not ask again.
			pc.asleep = false
			return decision{wake: pool, own: own}
		case pc.coming:
			return decision{own: own}
		}
		why = append(why, fmt.Sprintf("%s: %s", pool, pc.reason))
	}
	if len(own) > 0 {
		return decision{own: own} // it waits for its owner's resume (its deadline holds)
	}
	if len(down) == len(pools) {
		// The model failed on every pool that could run it: say so, with its load error.
		e := down[0]
		if len(down) > 1 {
			e = codec.Errorf(codec.CodeModelUnavailable, "model %s failed to load on every pool of the chain: %s", p.req.Model, strings.Join(why, "; ")).
				With("model", p.req.Model).With("pools", pools).With("reasons", why)
		}
		return decision{err: e}
	}
	e := codec.Errorf(codec.CodeNoWorker, "no live pool for class %s: %s", it.Class, strings.Join(why, "; ")).
		With("pools", pools).With("reasons", why)
	if len(pools) == 1 {
		if pe := c.pools[pools[0]].failed; pe != nil {
			// A chain of one whose runtime is missing: say exactly that.
			e = &codec.Error{Code: pe.Code, Message: pe.Message, Details: pe.Details}
		}
	}
	return decision{err: e}
}

// spillGrace is how long a new request waits for the first live pool of its chain before
// a later pool may take it.
const spillGrace = 20 * time.Millisecond

// maySpill reports whether p may go to a later pool of its chain than the first one with
// live workers. With replies straight to the client the gateway hears that a request is
// done one hop after its client does, so a client that sends its next request at once
// can find its preferred pool still counted busy, and the request would spill to the next
// pool that has room (an interactive request to the CUDA pool while the iGPU's worker is
// in fact free). So a new request waits up to spillGrace for the first live pool (the
// done claim frees it within a hop); after that, or when replies are relayed (the gateway
// knows first), it spills as before. A dispatch pass runs at every change and every
// 10 ms, so a spill under real overload comes within spillGrace + 10 ms.
func (c *capacity) maySpill(p *pending) bool {
	return c.cfg.Gateway.RelayReplies || c.now.Sub(p.accepted) >= spillGrace
}

// chainOf is where a request may go: its explicit pool, or its class's chain in cfg.
func chainOf(cfg *config.Config, p *pending) []string {
	if p.req.Pool != "" {
		return []string{p.req.Pool}
	}
	return cfg.Classes[p.class].Chain
}

// candidates are the pools that may serve p, in order: those of chainOf that load a model
// for its op (the named model, if one is named) and, when the request names a device,
// are on that device; as cfg has them.
func candidates(cfg *config.Config, p *pending) []string {
	pools := poolsFor(cfg, chainOf(cfg, p), p.op, p.req.Model)
	if p.req.Device == "" {
		return pools
	}
	var out []string
	for _, name := range pools {
		if cfg.Pool(name).Device == p.req.Device {
			out = append(out, name)
		}
	}
	return out
}

// resolve fills in p's id, class, deadline and default model from cfg, checks that its
// class, model and pool exist and fit, and returns the pools that may run it.
func resolve(cfg *config.Config, p *pending) ([]string, *codec.Error) {
	p.id = p.req.ID
	p.class = p.req.Class
	if p.class == "" {
		p.class = subjects.ClassInteractive
	}
	cl, ok := cfg.Classes[p.class]
	if !ok {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q (classes: %v)", p.class, cfg.ClassNames())
	}
	timeout := cl.Timeout.D()
	if p.req.TimeoutMS > 0 {
		// Compared in ms first: a huge timeout_ms would overflow a Duration.
		timeout = cl.MaxTimeout.D()
		if p.req.TimeoutMS < timeout.Milliseconds() {
			timeout = time.Duration(p.req.TimeoutMS) * time.Millisecond
		}
	}
	p.deadline = p.accepted.Add(timeout)
	if p.req.Model == "" {
		p.req.Model = cl.Models[p.op]
	}
	if p.req.Model != "" {
		if _, ok := cfg.Models[p.req.Model]; !ok {
			return nil, codec.Errorf(codec.CodeUnknownModel, "model %q is not configured", p.req.Model).With("model", p.req.Model)
		}
	}
	if p.req.Pool != "" {
		pc, ok := cfg.Pools[p.req.Pool]
		if !ok {
			return nil, codec.Errorf(codec.CodeUnknownPool, "pool %q is not configured (pools: %v)", p.req.Pool, cfg.PoolNames()).With("pool", p.req.Pool)
		}
		if !contains(pc.Classes, p.class) {
			return nil, codec.Errorf(codec.CodeBadRequest, "pool %s does not serve class %s", p.req.Pool, p.class).With("pool", p.req.Pool)
		}
	}
	pools := candidates(cfg, p)
	if len(pools) == 0 && p.req.Device != "" && len(poolsFor(cfg, chainOf(cfg, p), p.op, p.req.Model)) > 0 {
		return nil, codec.Errorf(codec.CodeUnknownPool, "no pool of class %s on device %q serves op %s%s", p.class, p.req.Device, p.op, modelSuffix(p.req.Model)).With("device", p.req.Device)
	}
	if len(pools) == 0 {
		return nil, codec.Errorf(codec.CodeUnknownModel, "no pool of class %s loads a model for op %s%s", p.class, p.op, modelSuffix(p.req.Model))
	}
	return pools, nil
}

func modelSuffix(m string) string {
	if m == "" {
		return ""
	}
	return " (model " + m + ")"
}
