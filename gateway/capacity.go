package gateway

import (
	"slices"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/subjects"
)

// capacity is what one dispatch pass knows of where work can go: taken once, when the
// pass first has an item to route (dispatcher.snapshot), from the tracker's live workers,
// the lifecycle's requests in flight and when each class was last active on each device,
// the measured service times and the supervisor's view of each pool. Routing (route.go)
// and the sharing policy (policy.go) read nothing else; route records in it each unit it
// takes, so that later items of the same pass see it.
//
// Only the dispatch loop routes, one pass at a time, and the lifecycle holds each unit a
// pass takes as soon as route decides it (L2), so the next snapshot counts it. Nothing else
// adds to what is in flight (answers coming back only take away), so a pass never gives
// a pool more than its snapshot had room for; what changes during a pass (answers,
// workers coming live or dying) is seen by the next one.
type capacity struct {
	cfg         *config.Config // read-only: classes (priority, min_share, degrade), pools (device, max_batch)
	now         time.Time
	pools       map[string]*poolCap
	workers     map[string]*workerCap    // live workers that take items sent to them alone, by id
	sent        uint64                   // orders the workers' lastSent after the lifecycle's sequence
	deviceSlots map[string]int           // live slots per device (each worker's max(1, slots))
	load        classCounts              // requests in flight per device and class, this pass's included
	leased      classCounts              // live leases per device and class (lease.go, rule 3)
	paused      pauseSet                 // the pauses in force (pause.go)
	gated       map[string]bool          // devices whose compute gate is closed (gate.go)
	active      lastActive               // when each class last had work queued for or running on each device
	est         map[estKey]time.Duration // measured service times
	// full holds pool+"\x00"+class once a pool is found full for a class in the pass: later
	// items skip it without looking again.
	full map[string]bool
}

// poolCap is one pool in a capacity snapshot.
type poolCap struct {
	slots       map[string]int // requests its live workers take at once, per class
	workerSlots int            // its live workers' slots (each worker's max(1, slots))
	busy        int            // requests in flight, this pass's included
	live        bool           // it has a live worker
	liveWorkers int            // how many
	// failedOn counts, per model, the live workers on which it failed to load, and
	// failErr is one of their errors (see modelDown).
	failedOn   map[string]int
	failErr    map[string]*codec.Error
	poolStatus // the supervisor's view, for when it has none
}

// newCapacity is an empty snapshot of cfg's pools at now: no live worker, nothing in
// flight, nothing measured, no word from the supervisor.
func newCapacity(cfg *config.Config, now time.Time) *capacity {
	c := &capacity{cfg: cfg, now: now, pools: map[string]*poolCap{}, workers: map[string]*workerCap{}, deviceSlots: map[string]int{}, load: classCounts{}, leased: classCounts{},
		active: lastActive{}, est: map[estKey]time.Duration{}, full: map[string]bool{}}
	for name := range cfg.Pools {
		c.pools[name] = &poolCap{slots: map[string]int{}, failedOn: map[string]int{}, failErr: map[string]*codec.Error{}}
	}
	return c
}

// snapshot takes the capacity of a dispatch pass at now.
func (d *dispatcher) snapshot(now time.Time) *capacity {
	c := newCapacity(d.conf(), now)
	for _, w := range d.tracker.Workers() {
		c.addLive(w)
	}
	h := d.lc.held()
	for pool, pc := range c.pools {
		pc.busy = h.busy[pool]
		pc.poolStatus = d.supervisor.poolStatus(pool, now)
	}
	for id, wc := range c.workers {
		wc.busy, wc.lastSent = h.workers[id], h.lastSent[id]
		c.sent = max(c.sent, wc.lastSent)
	}
	c.load, c.active = h.load, h.active
	c.leased = d.budget.leases.byDevice()
	c.paused = d.pauses.held(now)
	c.est = d.est.all()
	c.gated = d.gates.closed()
	return c
}

// addLive counts w's slots if it is a live worker of one of the snapshot's pools: a slot
// takes one request, or up to max_batch of the batch class in a batching pool.
func (c *capacity) addLive(w health.Worker) {
	pc := c.pools[w.HB.Pool]
	if pc == nil || !w.Live() {
		return
	}
	pc.live = true
	pc.liveWorkers++
	failed := map[string]bool{}
	for _, m := range w.HB.Models {
		if m.State == codec.ModelFailed && !failed[m.Name] {
			failed[m.Name] = true
			pc.failedOn[m.Name]++
			if pc.failErr[m.Name] == nil && m.Error != nil {
				pc.failErr[m.Name] = m.Error
			}
		}
	}
	slots := max(1, w.HB.Slots)
	if w.HB.Direct {
		c.workers[w.HB.Worker] = &workerCap{pool: w.HB.Pool, slots: slots, classes: w.HB.Classes, failed: failed}
	}
	pc.workerSlots += slots
	c.deviceSlots[c.cfg.Pool(w.HB.Pool).Device] += slots
	for i, class := range w.HB.Classes {
		if slices.Contains(w.HB.Classes[:i], class) {
			continue // listed twice, served once
		}
		per := 1
		if mb := c.cfg.Pool(w.HB.Pool).MaxBatch; class == subjects.ClassBatch && mb > 1 {
			per = mb
		}
		pc.slots[class] += slots * per
	}
}

// modelDown is the model_unavailable error of model in pool when it failed to load on
// every live worker of the pool (their heartbeats say so), else nil. Such a pool is
// passed over for requests of that model (route), as one that cannot serve them.
func (c *capacity) modelDown(pool, model string) *codec.Error {
	pc := c.pools[pool]
	if model == "" || pc.liveWorkers == 0 || pc.failedOn[model] < pc.liveWorkers {
		return nil
	}
	e := codec.Errorf(codec.CodeModelUnavailable, "model %s failed to load on every live worker of pool %s", model, pool).
		With("model", model).With("pool", pool)
	if fe := pc.failErr[model]; fe != nil {
		e.Message += ": " + fe.Message
		e = e.With("error", fe)
	}
	return e
}

// room is how many more requests of class the pass may send to pool: the free slots of
// its live workers serving the class, less what is already in flight.
func (c *capacity) room(pool, class string) int {
	pc := c.pools[pool]
	return pc.slots[class] - pc.busy
}

// take counts one request of class sent to pool in this pass.
func (c *capacity) take(pool, class string) {
	c.pools[pool].busy++
	c.load.add(c.cfg.Pool(pool).Device, class, 1)
}
