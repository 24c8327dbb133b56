package gateway

import (
	"fmt"
	"maps"
	"slices"
	"sync"
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

// workerCap is one live worker in a capacity snapshot that takes items sent to it alone.
type workerCap struct {
	pool    string
	slots   int            // max(1, its heartbeat's slots)
	classes []string       // the classes it serves
	busy    map[string]int // requests in flight sent to it, per class, this pass's included
	// lastSent orders the workers by when they were last given a request (the lifecycle's
	// sequence; 0: never), this pass's included.
	lastSent uint64
	failed   map[string]bool // models that failed to load there
}

// serves reports whether w is a worker of pool that serves class.
func (w *workerCap) serves(pool, class string) bool {
	return w.pool == pool && slices.Contains(w.classes, class)
}

// counts are w's requests in flight of the batch class and of the others.
func (w *workerCap) counts() (batch, other int) {
	for cl, n := range w.busy {
		if cl == subjects.ClassBatch {
			batch += n
		} else {
			other += n
		}
	}
	return batch, other
}

// room is how many more items of class w can start now (rule 2), in a pool whose slot
// takes size batch items.
func (w *workerCap) room(class string, size int) int {
	batch, other := w.counts()
	if class == subjects.ClassBatch {
		return (w.slots-other)*size - batch
	}
	return w.slots - other - (batch+size-1)/size
}

// bumpable reports whether a latency item may go to w although its slots are taken
// (rule 4): w holds a batch unit beyond its slots, prefetched and not started, and no
// latency item; its queue runs the latency item first, when the unit running ends.
func (w *workerCap) bumpable(size int) bool {
	batch, other := w.counts()
	return other == 0 && (batch+size-1)/size > w.slots
}

func (w *workerCap) inFlight() int {
	n := 0
	for _, v := range w.busy {
		n += v
	}
	return n
}

// lastActive is when each class was last active (had a request queued for, or running
// on, a device) per device and class. Owned by the lifecycle (lifecycle.go).
type lastActive map[string]map[string]time.Time

func (a lastActive) clone() lastActive {
	out := make(lastActive, len(a))
	for device, byClass := range a {
		out[device] = maps.Clone(byClass)
	}
	return out
}

func (a lastActive) see(device, class string, at time.Time) {
	if a[device] == nil {
		a[device] = map[string]time.Time{}
	}
	if at.After(a[device][class]) {
		a[device][class] = at
	}
}

// classCounts counts requests per key (a device, or a worker) and class: in flight, or
// held by leases. Owned by the lifecycle (and leases); snapshots get clones.
type classCounts map[string]map[string]int

// add adds n to key's count of class; a count back at zero is dropped (and a key with
// none left), so that keys that come and go (workers) leave nothing behind.
func (d classCounts) add(key, class string, n int) {
	if d[key] == nil {
		d[key] = map[string]int{}
	}
	if d[key][class] += n; d[key][class] == 0 {
		delete(d[key], class)
		if len(d[key]) == 0 {
			delete(d, key)
		}
	}
}

func (d classCounts) clone() classCounts {
	out := make(classCounts, len(d))
	for key, byClass := range d {
		out[key] = maps.Clone(byClass)
	}
	return out
}

// estimator keeps a measured service time (moving average of the worker's time from
// taking an item to answering it) per pool, op and model.
type estimator struct {
	mu sync.Mutex
	m  map[estKey]time.Duration
}

type estKey struct{ pool, op, model string }

func (e *estimator) observe(k estKey, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[estKey]time.Duration{}
	}
	if old, ok := e.m[k]; ok {
		d = (old*7 + d) / 8
	}
	e.m[k] = d
}

func (e *estimator) get(k estKey) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m[k]
}

// all is a copy of every measurement.
func (e *estimator) all() map[estKey]time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.m)
}

type pauseKey struct{ class, device, owner string }

// pauseSet is every pause in force at a moment, whatever its end.
type pauseSet map[pauseKey]bool

// holds reports whether class is paused on device for the work of owner (an account, ""
// for the local owner's): by the operator's pause, which holds everyone's, or by owner's
// own (rule 5).
func (s pauseSet) holds(class, device, owner string) bool {
	if len(s) == 0 {
		return false
	}
	for _, o := range []string{"", owner} {
		if s[pauseKey{class, "", o}] || s[pauseKey{class, device, o}] {
			return true
		}
		if owner == "" {
			break
		}
	}
	return false
}

// poolStatus is the supervisor's view of a pool, for when it has no live worker.
type poolStatus struct {
	reason string       // why it has no live worker
	coming bool         // workers are on their way: starting, or a remote pool not heard yet
	asleep bool         // a lazy_load pool not started yet (so coming): wake starts it
	failed *codec.Error // a start-up failure that a restart cannot fix
}

func mb(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
