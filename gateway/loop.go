package gateway

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/guard"
)

// The dispatch loop: the one goroutine that owns the lifecycle (lifecycle.go). Everything
// that happens to a request reaches it as an event on one channel; it applies the event
// to the lifecycle and hands the effects to the sender (sender.go). It also runs a
// dispatch pass whenever something changed (kick) and at least every 10 ms (deadlines of
// waiting items, the attempts' timers), and every 100 ms stops the pools idle for their
// keep_alive.

// Events: what the rest of the gateway tells the loop.
type (
	event interface{ isEvent() }
	// evAccept: a request decoded, validated and resolved to pools (L1).
	evAccept struct {
		p     *pending
		pools []string
	}
	// evClaim: a worker's claim, checked against its subject (L3, L4).
	evClaim struct{ c codec.Claim }
	// evReply: a relayed reply to attempt token seq (L4), or the server's "no
	// responders" for it (L5).
	evReply struct {
		seq          uint64
		msg          *nats.Msg
		noResponders bool
	}
	// evDied: the tracker judged worker of pool dead; others live in the pool (L7).
	evDied struct {
		pool, worker, why string
		others            int
	}
	// evCancel: a cancel of id by by (L9); found (if set) gets whether it found the
	// request.
	evCancel struct {
		id, by, tenant string
		onlyKnown      bool          // an unknown id is not remembered
		within         time.Duration // the canceller waits this long for the answer (0: no bound)
		found          chan<- bool
	}
	// evShutdown: answer what is queued, and with inFlight what is at workers (L10).
	evShutdown struct {
		inFlight bool
		done     chan<- struct{}
	}
	// evInspect runs fn on the loop's state (a read for status, metrics, resends).
	evInspect struct {
		fn   func(*lifecycle)
		done chan<- struct{}
	}
	// evDrained: done is closed once no request is unanswered (at once if none is).
	evDrained struct{ done chan struct{} }
)

func (evAccept) isEvent()   {}
func (evClaim) isEvent()    {}
func (evReply) isEvent()    {}
func (evDied) isEvent()     {}
func (evCancel) isEvent()   {}
func (evShutdown) isEvent() {}
func (evInspect) isEvent()  {}
func (evDrained) isEvent()  {}

// eventBacklog bounds the events waiting for the loop; a sender past it waits (the NATS
// callbacks' own pending limits then take the backlog).
const eventBacklog = 4096

// post hands ev to the loop. It waits while the loop's backlog is full, and once the loop
// has stopped (every request it held was answered at its shutdown, L10) drops ev, except
// a request being accepted: that one is answered no_worker here, as a queued one was, so
// that it too gets its one answer (a cache hit or a lookup that ended after the stop).
func (g *Gateway) post(ev event) {
	select {
	case <-g.loopDone:
	default:
		select {
		case g.events <- ev:
			return
		case <-g.loopDone:
		}
	}
	if a, ok := ev.(evAccept); ok {
		g.deliver(a.p, "", nil, codec.Errorf(codec.CodeNoWorker, "the gateway is shutting down"))
	}
}

// inspect runs fn on the loop's state and waits for it; false when the loop has stopped
// (fn did not run). Never called from the loop itself.
func (g *Gateway) inspect(fn func(*lifecycle)) bool {
	done := make(chan struct{})
	select {
	case g.events <- evInspect{fn: fn, done: done}:
	case <-g.loopDone:
		return false
	}
	select {
	case <-done:
		return true
	case <-g.loopDone:
		return false
	}
}

// step applies one event at now and carries out its effects.
func (g *Gateway) step(ev event, now time.Time) {
	defer guard.Recover(g.log, "dispatch loop", nil)
	lc := g.lc
	switch e := ev.(type) {
	case evAccept:
		g.apply(lc.accept(e.p, e.pools, now))
		g.kick()
	case evClaim:
		g.apply(lc.claim(e.c, now))
	case evReply:
		if e.noResponders {
			g.apply(lc.noResponders(e.seq, e.msg.Subject, now))
		} else {
			g.apply(lc.reply(e.seq, e.msg, now))
		}
	case evDied:
		g.apply(lc.died(e.pool, e.worker, e.why, e.others, now))
	case evCancel:
		found, out := lc.cancelWithin(e.id, e.by, e.tenant, e.onlyKnown, e.within, now)
		g.apply(out) // its answer goes out before the cancel's own reply
		if e.found != nil {
			e.found <- found
		}
	case evShutdown:
		g.apply(lc.shutdown(e.inFlight, now))
		close(e.done)
	case evInspect:
		e.fn(lc)
		close(e.done)
	case evDrained:
		g.drained = append(g.drained, e.done)
	}
}

// notifyDrained closes the channels of evDrained once no request is unanswered.
func (g *Gateway) notifyDrained() {
	if len(g.drained) == 0 || g.lc.count() > 0 {
		return
	}
	for _, done := range g.drained {
		close(done)
	}
	g.drained = nil
}

// dispatchLoop serves events, and with passes runs the dispatch passes, the timers and
// the idle pools' stops, until ctx ends. (Without passes the queues only hold what they
// get: unit tests of the handlers.)
func (g *Gateway) dispatchLoop(ctx context.Context, passes bool) {
	defer close(g.loopDone)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	idle := time.NewTicker(100 * time.Millisecond)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-g.events:
			g.step(ev, time.Now())
			g.notifyDrained()
			if g.lc.freed {
				// A unit came back or a request was queued again: a pass now, as for a
				// kick, rather than at the next tick.
				g.lc.freed = false
				g.kick()
			}
			continue
		case <-g.kickCh:
		case <-tick.C:
		case now := <-idle.C:
			if passes {
				// Nothing in flight (the loop's) and nothing queued for the pool, since when.
				g.supervisor.sleepIdle(g.conf(), now, func(pool string) (time.Time, bool) {
					since, idle := g.lc.idleSince(pool)
					return since, idle && !g.queuedFor(pool)
				})
			}
			continue
		}
		if passes {
			g.dispatchPass(time.Now())
			g.notifyDrained()
		}
	}
}

// dispatchPass fires the timers due and runs one pass of the scheduler.
func (g *Gateway) dispatchPass(now time.Time) {
	defer guard.Recover(g.log, "dispatch pass", nil)
	g.apply(g.lc.tick(now))
	g.apply(g.lc.pass(now, g.router(now)))
}

// startLoop starts the dispatch loop (passes: see dispatchLoop); the returned function
// stops it and waits.
func (g *Gateway) startLoop(passes bool) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	go g.dispatchLoop(ctx, passes)
	return func() {
		cancel()
		<-g.loopDone
	}
}

// loopEnv answers the lifecycle's questions (lifecycleEnv) from the config, the tracker
// and the supervisor.
type loopEnv struct{ g *Gateway }

func (e loopEnv) device(pool string) string {
	if pc := e.g.conf().Pools[pool]; pc != nil {
		return pc.Device
	}
	return ""
}

func (e loopEnv) replyDirect(p *pending, pool string) bool { return e.g.replyDirect(p, pool) }

// retryPools are the request's candidates (route.go).
func (e loopEnv) retryPools(p *pending) []string { return e.g.candidates(p) }

func (e loopEnv) hasLive(pool string) bool { return e.g.tracker.HasLive(pool) }

// mayRun: some pool has a live worker, or local workers on their way.
func (e loopEnv) mayRun(pools []string) bool {
	now := time.Now()
	for _, pool := range pools {
		if e.g.tracker.HasLive(pool) || e.g.supervisor.poolStatus(pool, now).coming {
			return true
		}
	}
	return false
}
