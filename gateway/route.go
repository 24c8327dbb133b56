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
// one is named), in chain order.
func (g *Gateway) poolsFor(chain []string, op, model string) []string {
	var out []string
	for _, name := range chain {
		for _, m := range g.cfg.Pools[name].Models {
			if (model == "" || m == model) && slices.Contains(opsOfKind[g.cfg.Models[m].Kind], op) {
				out = append(out, name)
				break
			}
		}
	}
	return out
}

// mapPaths checks that the request's path and out_path can be expressed on every
// candidate pool's host (pools may map path prefixes between hosts).
func (g *Gateway) mapPaths(p *pending, pools []string) *codec.Error {
	for _, pool := range pools {
		if _, ok := g.mapped(p, pool); !ok {
			return codec.Errorf(codec.CodeForbiddenPath, "path %s is not under any prefix that pool %s maps", p.req.Path, pool).With("pool", pool)
		}
		if _, ok := g.mappedOut(p, pool); !ok {
			return codec.Errorf(codec.CodeForbiddenPath, "out_path %s is not under any prefix that pool %s maps", p.req.OutPath, pool).With("pool", pool)
		}
	}
	return nil
}

// mapped returns the request's path as seen on pool's host: rewritten by the longest
// matching prefix of the pool's path_map, or unchanged when the pool has no map.
func (g *Gateway) mapped(p *pending, pool string) (string, bool) {
	return mapPrefix(g.cfg.Pools[pool].PathMap, p.req.Path)
}

// room is how many more requests this gateway may have in flight on a pool: the free
// slots of its live workers (a worker batching the batch class takes up to max_batch per
// slot), less what is already in flight.
func (g *Gateway) room(pool, class string) int {
	pc := g.cfg.Pools[pool]
	per := 1
	if class == subjects.ClassBatch && pc.MaxBatch > 1 {
		per = pc.MaxBatch
	}
	capacity := 0
	for _, w := range g.tracker.Live(pool) {
		if slices.Contains(w.HB.Classes, class) {
			capacity += max(1, w.HB.Slots) * per
		}
	}
	return capacity - g.fl.inFlight(pool)
}

// routePass is the state of one dispatch pass: the pools found full for a class so far,
// which later items of the same pass skip without looking again.
type routePass struct{ full map[string]bool }

func newRoutePass() *routePass { return &routePass{full: map[string]bool{}} }

// route is the sched.Router of a dispatch pass: the first candidate pool, in order, that
// is not reserved by higher-priority waiting work and has room. An item waits while some
// candidate pool can still come (live but full, or its workers starting); it fails with
// no_worker, naming every pool and why it was skipped, when none can.
//
// Only the dispatch loop routes, one pass at a time; what it reads of capacity (live
// workers, requests in flight) can only grow between its reads, by answers coming back,
// so a pass never gives a pool more than it has room for.
func (g *Gateway) route(ps *routePass, it *sched.Item, reserved map[string]bool) (string, error) {
	p := it.Value.(*pending)
	now := time.Now()
	infeasible := 0
	for _, pool := range it.Pools {
		key := pool + "\x00" + it.Class
		if reserved[pool] || ps.full[key] {
			continue
		}
		if g.room(pool, it.Class) <= 0 || !g.shareAllows(pool, it.Class, reserved) {
			// Full for this class for the rest of the pass: later items skip it cheaply.
			ps.full[key] = true
			continue
		}
		if !g.feasible(pool, p, now) {
			infeasible++
			continue
		}
		g.fl.hold(pool, g.cfg.Pools[pool].Device, it.Class)
		return pool, nil
	}
	if infeasible > 0 && infeasible == len(it.Pools) {
		return "", codec.Errorf(codec.CodeDeadlineExceeded, "cannot finish before its deadline on any of %v even if run now (measured service time)", it.Pools)
	}
	var why []string
	for _, pool := range it.Pools {
		if g.tracker.HasLive(pool) {
			return "", nil // busy: wait
		}
		g.supervisor.wake(pool) // a lazy_load pool starts on its first request
		reason, coming := g.supervisor.poolState(pool)
		if coming {
			return "", nil
		}
		why = append(why, fmt.Sprintf("%s: %s", pool, reason))
	}
	e := codec.Errorf(codec.CodeNoWorker, "no live pool for class %s: %s", it.Class, strings.Join(why, "; ")).
		With("pools", it.Pools).With("reasons", why)
	if pe := g.supervisor.poolError(it.Pools); pe != nil && len(it.Pools) == 1 {
		// A chain of one whose runtime is missing: say exactly that.
		e = &codec.Error{Code: pe.Code, Message: pe.Message, Details: pe.Details}
	}
	return "", e
}

// retryable reports whether a retry of p could run: some pool it may go to has a live
// worker, or local workers on their way.
func (g *Gateway) retryable(p *pending) bool {
	for _, pool := range g.retryPools(p) {
		if len(g.tracker.Live(pool)) > 0 {
			return true
		}
		if _, coming := g.supervisor.poolState(pool); coming {
			return true
		}
	}
	return false
}

// retryPools are the pools a retry may go to: the request's candidates.
func (g *Gateway) retryPools(p *pending) []string { return g.candidates(p) }

// chainOf is where a request may go: its explicit pool, or its class's chain.
func (g *Gateway) chainOf(p *pending) []string {
	if p.req.Pool != "" {
		return []string{p.req.Pool}
	}
	return g.cfg.Classes[p.class].Chain
}

// candidates are the pools that may serve p, in order: those of chainOf that load a model
// for its op (the named model, if one is named) and, when the request names a device,
// are on that device.
func (g *Gateway) candidates(p *pending) []string {
	pools := g.poolsFor(g.chainOf(p), p.op, p.req.Model)
	if p.req.Device == "" {
		return pools
	}
	var out []string
	for _, name := range pools {
		if g.cfg.Pools[name].Device == p.req.Device {
			out = append(out, name)
		}
	}
	return out
}
