package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/sched"
)

// The dispatcher: the dispatch loop, the one goroutine that owns the lifecycle
// (lifecycle.go), and the sender that carries out its effects (sender.go). Everything
// that happens to a request reaches the loop as an event on one channel; it applies the
// event to the lifecycle and hands the effects to the sender. It also runs a dispatch
// pass whenever something changed (kick) and at least every 10 ms (deadlines of waiting
// items, the attempts' timers), and every 100 ms stops the pools idle for their
// keep_alive.
//
// Its surface, all that the rest of the gateway calls: post (an event), inspect (a read
// of the loop's state, on the loop), kick (a pass soon), and the few calls built on post
// (submit, cancel, onClaim, onDead, awaitDrained, shutdown). The lifecycle and the
// channels of evDrained are the loop's alone: only step, pass and notifyDrained touch
// them (TestOnlyTheLoopTouchesTheLifecycle holds every other function to that).
type dispatcher struct {
	lc      *lifecycle      // the loop's alone
	drained []chan struct{} // the loop's alone: closed once nothing is unanswered (evDrained)

	// The loop's handle (its events, kick and stop, the class queues), made before the
	// concerns that ask the loop for a pass or a look, and given to them (Gateway.build).
	*loopHandle
	est *estimator // measured service times (their own lock)

	// The sender (sender.go): where work items go and answers come back.
	*sender

	// What it reads, given at construction (newDispatcher: dispatchDeps).
	conf       func() *config.Config
	log        *slog.Logger
	tracker    *health.Tracker
	supervisor *supervisor
	budget     *memoryBudget
	pauses     *pauses
	gates      *gates
}

// dispatchDeps are the concerns the dispatcher reads: the workers' heartbeats, the local
// pools' processes, the devices' memory, the pauses and the gates.
type dispatchDeps struct {
	tracker    *health.Tracker
	supervisor *supervisor
	budget     *memoryBudget
	pauses     *pauses
	gates      *gates
}

// loopHandle is what the rest of the gateway asks of the dispatch loop: a pass soon
// (kick), a read of its state on the loop (inspect, and holds and poolIdle on it), and
// whether it has stopped; with the class queues it reads. It is made first, so that the
// concerns that ask the loop are built with it, and the dispatcher, which reads them,
// after them with it (Gateway.build).
type loopHandle struct {
	events   chan event
	kickCh   chan struct{}
	loopDone chan struct{} // closed when the loop has stopped
	// queues are the class queues: their contents are the lifecycle's; their lengths
	// (sched's own lock) are read by status and the idle check.
	queues *sched.Queues
	conf   func() *config.Config
}

// newLoopHandle is the handle of the dispatch loop of config c (conf: the one in force).
func newLoopHandle(c *config.Config, conf func() *config.Config) *loopHandle {
	return &loopHandle{kickCh: make(chan struct{}, 1), events: make(chan event, eventBacklog), loopDone: make(chan struct{}),
		queues: newQueues(c), conf: conf}
}

// newDispatcher is the dispatcher of config c on the loop's handle h, its loop not
// started (start): it reads deps and est, and its sender sends with sd.
func newDispatcher(c *config.Config, log *slog.Logger, h *loopHandle, est *estimator, sd senderDeps, deps dispatchDeps) *dispatcher {
	d := &dispatcher{loopHandle: h, est: est, conf: h.conf, log: log,
		tracker: deps.tracker, supervisor: deps.supervisor, budget: deps.budget, pauses: deps.pauses, gates: deps.gates}
	d.sender = newSender(sd, d.post, h.conf, log, est)
	d.lc = newLifecycle(loopEnv{d}, d.queues, claimTimeout(c), accountBound(totalQueueBound(c)))
	return d
}

// eventBacklog bounds the events waiting for the loop; a sender past it waits (the NATS
// callbacks' own pending limits then take the backlog).
const eventBacklog = 4096

// post hands ev to the loop. It waits while the loop's backlog is full, and once the loop
// has stopped (every request it held was answered at its shutdown, L10) drops ev, except
// a request being accepted: that one is answered no_worker here, as a queued one was, so
// that it too gets its one answer (a cache hit or a lookup that ended after the stop).
func (d *dispatcher) post(ev event) {
	select {
	case <-d.loopDone:
	default:
		select {
		case d.events <- ev:
			return
		case <-d.loopDone:
		}
	}
	if a, ok := ev.(evAccept); ok {
		d.deliver(a.p, "", nil, codec.Errorf(codec.CodeNoWorker, "the gateway is shutting down"))
	}
}

// inspect runs fn on the loop's state and waits for it; false when the loop has stopped
// (fn did not run). Never called from the loop itself.
func (d *loopHandle) inspect(fn func(*lifecycle)) bool {
	done := make(chan struct{})
	select {
	case d.events <- evInspect{fn: fn, done: done}:
	case <-d.loopDone:
		return false
	}
	return d.await(done)
}

// await waits for done, or for the loop's stop; false on the stop.
func (d *loopHandle) await(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	case <-d.loopDone:
		return false
	}
}

// kick asks the dispatch loop for a pass.
func (d *loopHandle) kick() {
	select {
	case d.kickCh <- struct{}{}:
	default:
	}
}

// step applies one event at now and carries out its effects.
func (d *dispatcher) step(ev event, now time.Time) {
	defer guard.Recover(d.log, "dispatch loop", nil)
	lc := d.lc
	switch e := ev.(type) {
	case evAccept:
		d.carryOut(lc.accept(e.p, e.pools, now), now)
		d.kick()
	case evClaim:
		d.carryOut(lc.claim(e.c, e.verdictTo, now), now)
	case evReply:
		if e.noResponders {
			d.carryOut(lc.noResponders(e.seq, e.msg.Subject, now), now)
		} else {
			d.carryOut(lc.reply(e.seq, e.msg, now), now)
		}
	case evDied:
		d.carryOut(lc.died(e.pool, e.worker, e.why, e.others, now), now)
	case evCancel:
		found, out := lc.cancelWithin(e.id, e.by, e.account, e.onlyKnown, e.within, now)
		d.carryOut(out, now) // its answer goes out before the cancel's own reply
		if e.found != nil {
			e.found <- found
		}
	case evShutdown:
		d.carryOut(lc.shutdown(e.inFlight, now), now)
		close(e.done)
	case evInspect:
		e.fn(lc)
		close(e.done)
	case evDrained:
		d.drained = append(d.drained, e.done)
	}
}

// carryOut has the sender carry out effects; a send that failed comes back to the
// lifecycle as its event (L5), and the effects of that are carried out in turn: the
// sender never calls back into the lifecycle, and is never re-entered.
func (d *dispatcher) carryOut(effects []effect, now time.Time) {
	for len(effects) > 0 {
		failed := d.apply(effects)
		effects = nil
		for _, f := range failed {
			effects = append(effects, d.lc.sendFailed(f.id, f.attempt, f.err, now)...)
		}
	}
}

// notifyDrained closes the channels of evDrained once no request is unanswered.
func (d *dispatcher) notifyDrained() {
	if len(d.drained) == 0 || d.lc.count() > 0 {
		return
	}
	for _, done := range d.drained {
		close(done)
	}
	d.drained = nil
}

// loop serves events, and with passes runs the dispatch passes, the timers and the idle
// pools' stops, until ctx ends. (Without passes the queues only hold what they get: unit
// tests of the handlers.)
func (d *dispatcher) loop(ctx context.Context, passes bool) {
	defer close(d.loopDone)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	idle := time.NewTicker(100 * time.Millisecond)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-d.events:
			d.step(ev, time.Now())
			d.notifyDrained()
			if d.lc.freed {
				// A unit came back or a request was queued again: a pass now, as for a
				// kick, rather than at the next tick.
				d.lc.freed = false
				d.kick()
			}
			continue
		case <-d.kickCh:
		case <-tick.C:
		case now := <-idle.C:
			if passes {
				// Nothing in flight (the loop's) and nothing queued for the pool, since when.
				cfg := d.conf()
				d.supervisor.sleepIdle(cfg, now, func(pool string) (time.Time, bool) {
					since, idle := d.lc.idleSince(pool)
					return since, idle && !d.queuedFor(cfg, pool)
				})
			}
			continue
		}
		if passes {
			d.pass(time.Now())
			d.notifyDrained()
		}
	}
}

// pass fires the timers due and runs one pass of the scheduler.
func (d *dispatcher) pass(now time.Time) {
	defer guard.Recover(d.log, "dispatch pass", nil)
	d.carryOut(d.lc.tick(now), now)
	d.carryOut(d.lc.pass(now, d.router(now, d.lc)), now)
}

// start starts the dispatch loop (passes: see loop); the returned function stops it and
// waits.
func (d *dispatcher) start(passes bool) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	go d.loop(ctx, passes)
	return func() {
		cancel()
		<-d.loopDone
	}
}

// poolIdle reports whether pool has nothing in flight and nothing queued for it. Never
// called from the loop (it asks the loop).
func (d *loopHandle) poolIdle(pool string) bool {
	n := 0
	d.inspect(func(lc *lifecycle) { n = lc.inFlight(pool) })
	return n == 0 && !d.queuedFor(d.conf(), pool)
}

// queuedFor reports whether a request waits in a class queue that pool serves.
func (d *loopHandle) queuedFor(cfg *config.Config, pool string) bool {
	for _, class := range cfg.Pool(pool).Classes {
		if d.queues.Len(class) > 0 {
			return true
		}
	}
	return false
}

// awaitDrained waits, at most bound, until every request accepted is answered.
func (d *dispatcher) awaitDrained(bound time.Duration) {
	drained := make(chan struct{})
	d.post(evDrained{done: drained})
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
	case <-d.loopDone:
	}
}

// shutdown asks the loop to answer what is queued, and with inFlight what is at workers
// (L10), and waits for it.
func (d *dispatcher) shutdown(inFlight bool) {
	done := make(chan struct{})
	d.post(evShutdown{inFlight: inFlight, done: done})
	d.await(done)
}

// loopEnv answers the lifecycle's questions (lifecycleEnv) from the config, the tracker
// and the supervisor.
type loopEnv struct{ d *dispatcher }

func (e loopEnv) device(pool string) string {
	if pc := e.d.conf().Pools[pool]; pc != nil {
		return pc.Device
	}
	return ""
}

func (e loopEnv) replyDirect(p *pending, pool string) bool { return replyDirect(e.d.conf(), p, pool) }

// retryPools are the request's candidates (route.go).
func (e loopEnv) retryPools(p *pending) []string { return candidates(e.d.conf(), p) }

func (e loopEnv) hasLive(pool string) bool { return e.d.tracker.HasLive(pool) }

// mayRun: some pool has a live worker, or local workers on their way.
func (e loopEnv) mayRun(pools []string) bool {
	now := time.Now()
	for _, pool := range pools {
		if e.d.tracker.HasLive(pool) || e.d.supervisor.poolState(pool, now).coming {
			return true
		}
	}
	return false
}

// stopped is closed once the loop has stopped (every request it held was answered, L10).
func (d *loopHandle) stopped() <-chan struct{} { return d.loopDone }

// holds reports whether the loop holds the unanswered request id of owner.
func (d *loopHandle) holds(id, owner string) bool {
	held := false
	d.inspect(func(lc *lifecycle) {
		p, ok := lc.get(id)
		held = ok && p.owner == owner
	})
	return held
}

// submit accepts a decoded and validated request (p.req, whose id is set) for p.op:
// class, deadline, model and pool checks and the route check here, under one
// configuration, then the loop takes it (L1).
func (d *dispatcher) submit(p *pending) {
	cfg := d.conf()
	pools, e := resolve(cfg, p)
	if e == nil {
		e = mapPaths(cfg, p, pools)
	}
	if e != nil {
		d.deliver(p, "", nil, e)
		return
	}
	d.post(evAccept{p: p, pools: pools})
}

// onDead is called by the tracker when a worker is judged dead: the loop answers or
// retries every request it held (L7).
func (d *dispatcher) onDead(id, pool, why string) {
	// A silent local worker is killed first, and its requests retried once it is gone:
	// while it lives its subscription stays in its pool's queue group, and a retry could
	// be delivered to it again.
	d.supervisor.workerDead(id, why)
	others := 0
	for _, w := range d.tracker.Live(pool) {
		if w.HB.Worker != id {
			others++
		}
	}
	d.post(evDied{pool: pool, worker: id, why: why, others: others})
}

// cancelAs cancels a queued or in-flight request by id for the sender by (see
// canCancel), and reports whether it found one (L9). A cancel that may not cancel the
// request finds nothing, as if the id were unknown.
func (d *dispatcher) cancelAs(id, by, account string) bool {
	return d.cancel(accountScopedID(account, id), by, account, false) // an account names its own ids (account.go, rule 3)
}

// cancel posts a cancel of the gateway's id and waits for its finding; with onlyKnown
// an unknown id is not remembered as cancelled.
func (d *dispatcher) cancel(id, by, account string, onlyKnown bool) bool {
	found := make(chan bool, 1)
	d.post(evCancel{id: id, by: by, account: account, onlyKnown: onlyKnown, found: found})
	select {
	case ok := <-found:
		return ok
	case <-d.loopDone:
		return false
	}
}

// router decides the items of one dispatch pass at now (the lifecycle's pass, L2). It
// takes the pass's capacity snapshot when it first has an item to route, and decides each
// item with place, which reads only the snapshot and the item; the lifecycle then holds
// the unit taken, and wakes a lazy pool. An item of a latency class that waits marks its
// pools' devices active (reserve: the policy's reservation).
func (d *dispatcher) router(now time.Time, lc *lifecycle) decide {
	var snap *capacity
	return func(it *sched.Item, reserved map[string]bool) decision {
		if snap == nil {
			snap = d.snapshot(now, lc.held())
		}
		d := snap.place(it, reserved)
		d.reserve = d.pool == "" && d.err == nil && snap.reserves(it.Class)
		return d
	}
}

// snapshot takes the capacity of a dispatch pass at now.
func (d *dispatcher) snapshot(now time.Time, h heldNow) *capacity {
	c := newCapacity(d.conf(), now)
	for _, w := range d.tracker.Workers() {
		c.addLive(w)
	}
	for pool, pc := range c.pools {
		pc.busy = h.busy[pool]
		pc.poolStatus = d.supervisor.poolState(pool, now)
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

// newQueues makes the class queues of the config: each class's priority, bounds (count
// and bytes) and shed policy, and strict priority unless the policy is fifo.
func newQueues(c *config.Config) *sched.Queues {
	var classes []sched.Class
	for _, name := range c.ClassNames() {
		cl := c.Classes[name]
		classes = append(classes, sched.Class{Name: name, Priority: cl.Priority, Bound: cl.QueueBound, MaxBytes: int64(cl.QueueBytes), Shed: cl.Shed})
	}
	q := sched.New(classes)
	q.FIFO = c.Gateway.Policy == config.PolicyFIFO
	return q
}
