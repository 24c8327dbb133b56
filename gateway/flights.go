package gateway

import (
	"cmp"
	"context"
	"maps"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// flights is the one owner of the requests this gateway has accepted and not yet
// answered, and of what they hold: the pool capacity taken by dispatched requests (per
// pool and per device and class), when each class was last active on each device (for
// the sharing policy's reservation), which worker claimed each one, the last worker death
// of each pool, and cancels that arrived before their request. Everything here is
// guarded by its one lock, and so are the dispatch fields of each pending request
// (attempt, deaths, pool, worker, cancel, cancelAsked); no method calls out of the type
// while holding it.
//
// A request's life in it: admit (accepted) → hold (a dispatch pass gave it a pool) →
// dispatch (sent; attempt n) → claim (a worker took it) → release (its answer, or its
// worker's death, came back) → and, when answered, finish. A retry goes round again from
// hold.
type flights struct {
	mu        sync.Mutex
	byID      map[string]*pending
	busy      map[string]int       // requests in flight per pool
	used      map[string]time.Time // when each pool last took or gave back a request
	load      classCounts          // requests in flight per device and class
	workers   classCounts          // requests in flight per worker they were sent to, and class
	sentSeq   uint64               // counts the requests held for a worker
	lastSent  map[string]uint64    // per worker, sentSeq when it was last given a request
	active    lastActive           // when each class last had work queued for or running on each device
	lastDeath map[string]death
	early     map[string]earlyCancel // cancels of ids not seen yet
	// perTenant counts the unanswered requests of each tenant other than the local
	// owner; tenantMax bounds it (0: no bound). See identity.go, rule 5.
	perTenant map[string]int
	tenantMax int
}

func newFlights() *flights {
	return &flights{byID: map[string]*pending{}, busy: map[string]int{}, used: map[string]time.Time{}, load: classCounts{}, workers: classCounts{}, lastSent: map[string]uint64{}, active: lastActive{}, lastDeath: map[string]death{}, early: map[string]earlyCancel{}, perTenant: map[string]int{}}
}

// death is the last worker death seen in a pool.
type death struct {
	worker, why string
	at          time.Time
}

// earlyCancel is a cancel of an id not seen yet, and who sent it.
type earlyCancel struct {
	at     time.Time
	by     string
	tenant string
}

// cancelMemory is how long a cancel of an unknown id is remembered, so that a request
// that arrives after its own cancel is answered cancelled: the API's ops are separate
// subscriptions, so a cancel sent right after its request is often handled first.
const cancelMemory = 10 * time.Second

// maxEarlyCancels bounds the cancels of unknown ids remembered at once.
const maxEarlyCancels = 10000

// admit records an accepted request. It refuses a request whose cancel came first
// (cancelled) or whose id is already in flight (bad_request).
func (f *flights) admit(p *pending) *codec.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.early[p.id]; ok && canCancel(p.owner, c.by) {
		// Its cancel overtook it (each op is a subscription of its own).
		delete(f.early, p.id)
		return codec.Errorf(codec.CodeCancelled, "cancelled by the client before it arrived")
	}
	if _, dup := f.byID[p.id]; dup {
		return codec.Errorf(codec.CodeBadRequest, "a request with id %q is already in progress", cmp.Or(p.clientID, p.id))
	}
	if p.tenant != "" {
		// One tenant holds at most tenantMax requests unanswered (queued or in flight),
		// so its flood leaves the queues' room to the others (identity.go, rule 5).
		if n := f.perTenant[p.tenant]; f.tenantMax > 0 && n >= f.tenantMax {
			return codec.Errorf(codec.CodeOverloaded, "you have %d requests queued or in flight, this gateway's bound for one owner", n).With("limit", f.tenantMax)
		}
		f.perTenant[p.tenant]++
	}
	f.byID[p.id] = p
	return nil
}

// finish forgets an answered request.
func (f *flights) finish(p *pending) {
	f.mu.Lock()
	if f.byID[p.id] == p {
		delete(f.byID, p.id)
		if p.tenant != "" {
			if f.perTenant[p.tenant]--; f.perTenant[p.tenant] <= 0 {
				delete(f.perTenant, p.tenant)
			}
		}
	}
	f.mu.Unlock()
}

// get returns the unanswered request with id.
func (f *flights) get(id string) (*pending, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.byID[id]
	return p, ok
}

// all returns every unanswered request.
func (f *flights) all() []*pending {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*pending, 0, len(f.byID))
	for _, p := range f.byID {
		out = append(out, p)
	}
	return out
}

// count is the number of unanswered requests.
func (f *flights) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byID)
}

// hold takes one unit of pool (on device) for p, a request of class: a dispatch pass at
// time at gave it that pool, and the worker it is to be sent to ("" for the pool's queue
// group).
func (f *flights) hold(p *pending, pool, worker, device, class string, at time.Time) {
	f.mu.Lock()
	f.busy[pool]++
	f.used[pool] = time.Now()
	f.load.add(device, class, 1)
	if worker != "" {
		f.workers.add(worker, class, 1)
		f.sentSeq++
		f.lastSent[worker] = f.sentSeq
	}
	f.active.see(device, class, at)
	p.target = worker
	f.mu.Unlock()
}

// release gives back what hold took, once the request's dispatch is over.
func (f *flights) release(p *pending, pool, device string) {
	f.mu.Lock()
	f.busy[pool]--
	f.used[pool] = time.Now()
	f.load.add(device, p.class, -1)
	if p.target != "" {
		f.workers.add(p.target, p.class, -1)
	}
	f.active.see(device, p.class, time.Now())
	p.cancel, p.target, p.done = nil, "", nil
	f.mu.Unlock()
}

// idleSince reports when pool last had a request back, if none is in flight now (ok
// false while one is, or when it never had one).
func (f *flights) idleSince(pool string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.used[pool]
	return t, ok && f.busy[pool] == 0
}

// queued records that a dispatch pass at time at left an item of class waiting for pools
// on devices.
func (f *flights) queued(devices []string, class string, at time.Time) {
	f.mu.Lock()
	for _, d := range devices {
		f.active.see(d, class, at)
	}
	f.mu.Unlock()
}

// inFlight is the number of requests dispatched to pool and not yet back.
func (f *flights) inFlight(pool string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.busy[pool]
}

// heldNow is a copy of what is in flight: requests per pool, per device and class, and
// per worker and class, when each worker was last given one, and when each class was last active on each device.
type heldNow struct {
	busy     map[string]int
	load     classCounts
	workers  classCounts
	lastSent map[string]uint64
	active   lastActive
}

// held is a copy of what is in flight now.
func (f *flights) held() heldNow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return heldNow{busy: maps.Clone(f.busy), load: f.load.clone(), workers: f.workers.clone(), lastSent: maps.Clone(f.lastSent), active: f.active.clone()}
}

// running counts the dispatched requests by class.
func (f *flights) running() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for _, p := range f.byID {
		if p.cancel != nil {
			out[p.class]++
		}
	}
	return out
}

// dispatch marks p sent to pool as its next attempt, cancellable with cancel, and
// returns the worker it goes to ("" for the pool's queue group). It reports false,
// changing nothing, when the client cancelled p on its way out of the queue.
// done, when not nil, gets the attempt's "done" claim (its worker answered the client).
func (f *flights) dispatch(p *pending, pool string, cancel context.CancelCauseFunc, done chan<- codec.Claim) (attempt int, target string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.cancelAsked {
		return 0, "", false
	}
	p.attempt++
	p.pool, p.worker, p.cancel, p.done = pool, "", cancel, done
	return p.attempt, p.target, true
}

// unclaimed returns how to cancel attempt of p, dispatched to pool at sent, when no
// claim came: with errLost when a worker of the pool died since (it may have died before
// its claim left it), else errUnclaimed. It returns nil when a claim came or the attempt
// is over.
func (f *flights) unclaimed(p *pending, attempt int, pool string, sent time.Time, after time.Duration) (context.CancelCauseFunc, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.attempt != attempt || p.worker != "" || p.cancel == nil {
		return nil, nil
	}
	if d, ok := f.lastDeath[pool]; ok && d.at.After(sent) {
		return p.cancel, &errLost{worker: d.worker, why: d.why + " (before its claim was sent)"}
	}
	return p.cancel, &errUnclaimed{after: after}
}

// claim records a claim of worker of pool on attempt of a request (when that is still
// the request's current dispatch): that it took it, or (done) that it answered the client
// itself, which is handed to the request's dispatch when it waits for that, and the
// claiming worker was the one it was sent to (or the one that took it).
func (f *flights) claim(c codec.Claim) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.byID[c.ID]
	if !ok || p.attempt != c.Attempt || p.pool != c.Pool {
		return
	}
	switch c.State {
	case codec.ClaimTaken:
		p.worker = c.Worker
	case codec.ClaimDone:
		if p.done != nil && (c.Worker == p.target || c.Worker == p.worker || (p.target == "" && p.worker == "")) {
			p.worker = c.Worker
			select {
			case p.done <- c:
			default: // one is enough
			}
		}
	}
}

// lostOne is a request hit by a worker's death and how to stop its dispatch.
type lostOne struct {
	p      *pending
	cancel context.CancelCauseFunc
}

// died records the death of worker in pool and returns the requests it held: those it
// claimed, those sent to it alone whose claim had not arrived yet, and, when the pool
// has no other live worker (others == 0), those sent to the pool's queue group whose
// claim had not arrived yet.
func (f *flights) died(pool, worker, why string, others int) []lostOne {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastDeath[pool] = death{worker: worker, why: why, at: time.Now()}
	delete(f.lastSent, worker)
	var hit []lostOne
	for _, p := range f.byID {
		if p.cancel == nil || p.pool != pool {
			continue
		}
		unclaimed := p.worker == ""
		if p.worker == worker || (unclaimed && p.target == worker) || (unclaimed && p.target == "" && others == 0) {
			hit = append(hit, lostOne{p, p.cancel})
		}
	}
	return hit
}

// addDeath counts one more holder of p that died, and returns the count.
func (f *flights) addDeath(p *pending) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	p.deaths++
	return p.deaths
}

// cancelAsked reports whether the client cancelled p while it was between queues.
func (f *flights) cancelAsked(p *pending) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return p.cancelAsked
}

// askCancel applies a cancel of id sent by by (see canCancel). found reports whether an
// unanswered request with id exists that by may cancel; it is marked cancelAsked, and
// dispatched says whether it is out at a worker (with its cancel function). A cancel of an
// unknown id is remembered for a while (see cancelMemory).
func (f *flights) askCancel(id, by, tenant string) (p *pending, dispatched, found bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.byID[id]
	if !ok {
		now := time.Now()
		for k, c := range f.early {
			if now.Sub(c.at) > cancelMemory {
				delete(f.early, k)
			}
		}
		// Bounded in total, and per tenant (identity.go, rule 5): one tenant's cancels of
		// made-up ids never crowd out another's.
		if len(f.early) < maxEarlyCancels && (tenant == "" || f.earlyOf(tenant) < tenantBound(maxEarlyCancels)) {
			f.early[id] = earlyCancel{at: now, by: by, tenant: tenant}
		}
		return nil, false, false
	}
	if !canCancel(p.owner, by) {
		return nil, false, false
	}
	p.cancelAsked = true
	return p, p.cancel != nil, true
}

// earlyOf is how many early cancels tenant has remembered: f.mu held.
func (f *flights) earlyOf(tenant string) int {
	n := 0
	for _, c := range f.early {
		if c.tenant == tenant {
			n++
		}
	}
	return n
}

// mayCancel reports whether by may cancel the unanswered request id (false when there is
// none).
func (f *flights) mayCancel(id, by string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.byID[id]
	return ok && canCancel(p.owner, by)
}
