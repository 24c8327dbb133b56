package gateway

import (
	"cmp"
	"container/heap"
	"maps"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/sched"
)

// The life of a request in this gateway, from its acceptance to its one terminal answer.
//
// One goroutine, the dispatch loop (loop.go), owns the lifecycle: every request accepted
// and not yet answered (its flight), the class queues' contents, what the requests in
// flight hold (per pool, device, worker and class), and the timers of their attempts.
// NATS callbacks, API and HTTP handlers, the job runner and the tracker send it events
// (loop.go); each step below is a function of (state, event, now) that changes the state
// and returns effects (send a work item, answer a client, publish a cancel, ...) that a
// thin sender carries out (sender.go). Nothing else reads or writes a flight.
//
// A flight's states and the rules that move it (each named where it is enforced):
//
//	event              state           rule  next state      effects
//	accepted           -               L1    queued          record
//	                                   L1    -               answer cancelled | cache hit | bad_request | overloaded
//	dispatch pass      queued          L2    sent            send (attempt n+1)
//	                   queued          L2    -               answer (the queue's error: deadline, no_worker, ...)
//	                   queued          L2    queued          wake (a sleeping pool); a waiting latency item reserves
//	claim taken        sent            L3    claimed         - | verdict own (a claim with a reply subject)
//	                   other           L3a   (same)          - | verdict not own (late, stale or another's)
//	reply (relayed)    sent|claimed    L4    -               relay (the answer)
//	claim done         sent|claimed    L4    -               settled (the worker answered the client)
//	no responders      sent            L5    backoff | -     - | answer no_worker
//	send failed        sent            L5    -               answer internal
//	claim timer        sent            L6    queued (front)  -          (no claim: never delivered)
//	                   sent            L7    ...             as a death (a worker died since the send)
//	worker died        sent|claimed    L7    queued (front)  retried
//	                                   L7    -               answer worker_lost | poison_input
//	deadline timer     sent|claimed    L8    -               answer deadline_exceeded
//	backoff timer      backoff         L5    queued (front)  -
//	cancel             queued|backoff  L9    -               answer cancelled
//	                   sent|claimed    L9    (same)          cancel (the worker answers); bounded: a cancel timer
//	cancel timer       sent|claimed    L9    -               answer cancelled (its worker did not confirm in time)
//	shutdown           queued|backoff  L10   -               answer no_worker
//	                   sent|claimed    L10   -               answer worker_lost
//
// Every transition to "-" (the flight forgotten) emits exactly one terminal effect
// (answer, relay or settled), and no other transition emits one: that is how every
// request gets exactly one answer.

// flightState is where a request is in its life.
type flightState int

const (
	stQueued  flightState = iota // in its class queue (sched)
	stSent                       // attempt sent to a pool, no claim yet
	stClaimed                    // a worker took the attempt
	stBackoff                    // out of the queue for a moment (L5), to be queued again
)

func (s flightState) String() string {
	return [...]string{"queued", "sent", "claimed", "backoff"}[s]
}

// flight is the lifecycle's state of one accepted request.
type flight struct {
	p       *pending
	state   flightState
	attempt int    // attempts sent so far
	deaths  int    // holders that died with it (L7)
	pool    string // the pool of the current (or last) attempt
	device  string // pool's device
	target  string // the worker the attempt was sent to ("" for the pool's queue group)
	worker  string // the worker that claimed it
	direct  bool   // the attempt's worker answers the client itself (reply_direct)
	sentAt  time.Time
	seq     uint64   // the attempt's reply token (relayed replies come to the reply inbox under it)
	timers  []*timer // the current attempt's timers in the heap
	// cancelAsked: the client cancelled it while it was at a worker (L9); a retry of it
	// is answered cancelled instead of being queued again.
	cancelAsked bool
	// cancelWithin: the bound of a cancel whose canceller waits (L9's cancel timer).
	cancelWithin time.Duration
}

// lifecycleEnv is what the lifecycle asks of the rest of the gateway: questions about the
// configuration and about the live workers, never an action.
type lifecycleEnv interface {
	// device is the device of pool.
	device(pool string) string
	// replyDirect reports whether a worker of pool answers p straight to its client.
	replyDirect(p *pending, pool string) bool
	// retryPools are the pools a retry of p may go to.
	retryPools(p *pending) []string
	// mayRun reports whether any of pools has a live worker or local workers coming.
	mayRun(pools []string) bool
	// hasLive reports whether pool has a live worker.
	hasLive(pool string) bool
}

// The lifecycle's bounds and intervals.
const (
	// cancelMemory is how long a cancel of an unknown id is remembered, so that a request
	// that arrives after its own cancel is answered cancelled: the API's ops are separate
	// subscriptions, so a cancel sent right after its request is often handled first.
	cancelMemory = 10 * time.Second
	// maxEarlyCancels bounds the cancels of unknown ids remembered at once.
	maxEarlyCancels = 10000
	// answerGrace: past its deadline, a request's worker has this long to answer
	// deadline_exceeded itself (L8).
	answerGrace = time.Second
	// noResponderBackoff: a request that found no subscriber in a pool with live workers
	// is queued again after this long (L5).
	noResponderBackoff = 50 * time.Millisecond
	// noResponderMin: it is retried only while more than this is left to its deadline.
	noResponderMin = 100 * time.Millisecond
)

// lifecycle is the state the dispatch loop owns (see the table above). It is not safe
// for concurrent use, by design: one goroutine owns it.
type lifecycle struct {
	env          lifecycleEnv
	queues       *sched.Queues
	claimTimeout time.Duration

	byID  map[string]*flight
	bySeq map[uint64]*flight // flights with a relayed attempt out, by its reply token
	seq   uint64

	busy      map[string]int       // requests in flight per pool
	used      map[string]time.Time // when each pool last took or gave back a request
	load      classCounts          // requests in flight per device and class
	workers   classCounts          // requests in flight per worker they were sent to, and class
	sentSeq   uint64               // counts the requests held for a worker
	lastSent  map[string]uint64    // per worker, sentSeq when it was last given a request
	active    lastActive           // when each class last had work queued for or running on each device
	lastDeath map[string]death     // the last worker death of each pool
	early     map[string]earlyCancel
	// perAccount counts the unanswered requests of each account other than the local
	// owner; accountMax bounds it (0: no bound). See account.go, rule 5.
	perAccount map[string]int
	accountMax int

	timers timerHeap
	// freed: a unit was given back or a request queued again since the loop last looked
	// (it runs a dispatch pass then).
	freed bool
}

func newLifecycle(env lifecycleEnv, queues *sched.Queues, claimTimeout time.Duration, accountMax int) *lifecycle {
	return &lifecycle{env: env, queues: queues, claimTimeout: claimTimeout, accountMax: accountMax,
		byID: map[string]*flight{}, bySeq: map[uint64]*flight{}, busy: map[string]int{}, used: map[string]time.Time{},
		load: classCounts{}, workers: classCounts{}, lastSent: map[string]uint64{}, active: lastActive{},
		lastDeath: map[string]death{}, early: map[string]earlyCancel{}, perAccount: map[string]int{}}
}

// death is the last worker death seen in a pool.
type death struct {
	worker, why string
	at          time.Time
}

// earlyCancel is a cancel of an id not seen yet, and who sent it.
type earlyCancel struct {
	at      time.Time
	by      string
	account string
}

// Effects: what a step asks the sender to do (sender.go). Exactly the terminal ones
// (effAnswer, effRelay, effSettled) end a request.
type (
	effect interface{ isEffect() }
	// effRecord records an accepted request in the answers bucket (failover.go, rule 4).
	effRecord struct{ p *pending }
	// effSend sends attempt of p to pool: to worker target ("" for the pool's queue
	// group), answered to the gateway's reply inbox under seq, or to the client (direct).
	effSend struct {
		p       *pending
		pool    string
		target  string
		attempt int
		direct  bool
		seq     uint64
	}
	// effAnswer answers p (terminal): body or err; pool is where it ran ("" if nowhere).
	effAnswer struct {
		p    *pending
		pool string
		body []byte
		err  *codec.Error
	}
	// effRelay answers p with its worker's reply msg (terminal).
	effRelay struct {
		p    *pending
		pool string
		msg  *nats.Msg
	}
	// effSettled ends p, whose worker answered its client itself (terminal).
	effSettled struct {
		p     *pending
		pool  string
		claim codec.Claim
	}
	// effCancel asks the workers to cancel the request id (of p).
	effCancel struct {
		id string
		p  *pending
	}
	// effRetried counts a retry of p after a worker's death; effUnclaimed logs a
	// redispatch.
	effRetried   struct{ p *pending }
	effUnclaimed struct {
		p    *pending
		pool string
	}
	// effWake starts a sleeping lazy_load pool.
	effWake struct{ pool string }
	// effVerdict answers a worker's claim with its verdict v (L3a), on subject to.
	effVerdict struct {
		to string
		v  codec.ClaimVerdict
	}
)

func (effRecord) isEffect()    {}
func (effSend) isEffect()      {}
func (effAnswer) isEffect()    {}
func (effRelay) isEffect()     {}
func (effSettled) isEffect()   {}
func (effCancel) isEffect()    {}
func (effRetried) isEffect()   {}
func (effUnclaimed) isEffect() {}
func (effWake) isEffect()      {}
func (effVerdict) isEffect()   {}

func answerErr(p *pending, pool string, e *codec.Error) effect {
	return effAnswer{p: p, pool: pool, err: e}
}

// forget ends f: out of every table. The caller emits its terminal effect.
func (lc *lifecycle) forget(f *flight) {
	if lc.byID[f.p.id] != f {
		return
	}
	delete(lc.byID, f.p.id)
	lc.stopTimers(f)
	if f.seq != 0 {
		delete(lc.bySeq, f.seq)
	}
	if t := f.p.account; t != "" {
		if lc.perAccount[t]--; lc.perAccount[t] <= 0 {
			delete(lc.perAccount, t)
		}
	}
}

// accept is L1: a request decoded, validated and resolved (pools) enters its class queue,
// unless its cancel came first (cancelled), it was found in the result cache (answered
// with the hit), its id is in flight already (bad_request), or its account holds its bound
// of requests (overloaded). A full queue refuses it, or drops its oldest (drop_oldest),
// answered overloaded.
func (lc *lifecycle) accept(p *pending, pools []string, now time.Time) []effect {
	if c, ok := lc.early[p.id]; ok && canCancel(p.owner, c.by) {
		// Its cancel overtook it (each op is a subscription of its own), or came while
		// it was looked up in the cache: the cancel wins over a hit too, so a client's
		// own earlier cancel is never ignored because the answer was at hand.
		delete(lc.early, p.id)
		return []effect{answerErr(p, "", codec.Errorf(codec.CodeCancelled, "cancelled by the client before it arrived"))}
	}
	if p.hit != nil {
		return []effect{effAnswer{p: p, body: p.hit}} // its one answer: never queued
	}
	if _, dup := lc.byID[p.id]; dup {
		return []effect{answerErr(p, "", codec.Errorf(codec.CodeBadRequest, "a request with id %q is already in progress", cmp.Or(p.clientID, p.id)))}
	}
	if p.account != "" {
		// One account holds at most accountMax requests unanswered (queued or in flight),
		// so its flood leaves the queues' room to the others (account.go, rule 5).
		if n := lc.perAccount[p.account]; lc.accountMax > 0 && n >= lc.accountMax {
			return []effect{answerErr(p, "", codec.Errorf(codec.CodeOverloaded, "you have %d requests queued or in flight, this gateway's bound for one owner", n).With("limit", lc.accountMax))}
		}
	}
	dropped, err := lc.queues.Push(&sched.Item{ID: p.id, Class: p.class, Pools: pools, Deadline: p.deadline, Bytes: p.size, Value: p})
	if err != nil {
		return []effect{answerErr(p, "", codec.AsError(err))}
	}
	f := &flight{p: p, state: stQueued}
	lc.byID[p.id] = f
	if p.account != "" {
		lc.perAccount[p.account]++
	}
	var out []effect
	for _, d := range dropped {
		if df := lc.byID[d.ID]; df != nil {
			lc.forget(df)
			out = append(out, answerErr(df.p, "", codec.Errorf(codec.CodeOverloaded, "dropped from the full %s queue for a newer request (drop_oldest)", p.class)))
		}
	}
	return append(out, effRecord{p})
}

// decide is the routing decision of one item of a dispatch pass (route.go's router).
type decide func(it *sched.Item, reserved map[string]bool) decision

// pass is L2: one pass of the scheduler over the queues. An item given a pool is held
// there (its unit counted) and sent as its next attempt; an item the scheduler fails is
// answered with its error; a waiting item of a latency class marks its devices active
// (the sharing policy's reservation).
func (lc *lifecycle) pass(now time.Time, route decide) []effect {
	var out []effect
	assigned, failed := lc.queues.Dispatch(now, lc.router(now, route, &out))
	for _, fl := range failed {
		if f := lc.byID[fl.Item.ID]; f != nil {
			lc.forget(f)
			out = append(out, answerErr(f.p, "", codec.AsError(fl.Err)))
		}
	}
	for _, a := range assigned {
		if f := lc.byID[a.Item.ID]; f != nil {
			out = append(out, lc.send(f, now))
		}
	}
	return out
}

// router is the sched.Router of a pass at now: route decides each item; a unit given is
// held, a waiting item of a reserving class marks its pools' devices active, and a pool
// to wake is added to out.
func (lc *lifecycle) router(now time.Time, route decide, out *[]effect) sched.Router {
	return func(it *sched.Item, reserved map[string]bool) (string, error) {
		d := route(it, reserved)
		switch {
		case d.pool != "":
			if f := lc.byID[it.ID]; f != nil {
				lc.hold(f, d.pool, d.worker, it.Class, now)
			}
		case d.reserve:
			for _, pool := range it.Pools {
				if !d.own[pool] {
					lc.active.see(lc.env.device(pool), it.Class, now)
				}
			}
		}
		if d.wake != "" {
			*out = append(*out, effWake{d.wake})
		}
		if len(d.own) > 0 {
			// It waits, holding only the pools its owner's pause leaves it (pause.go, rule 5).
			var keep []string
			for _, pool := range it.Pools {
				if !d.own[pool] {
					keep = append(keep, pool)
				}
			}
			return "", sched.Waits{Pools: keep}
		}
		return d.pool, d.err
	}
}

// hold takes one unit of pool for f (L2): counted per pool, device and class, and per
// worker when it goes to one.
func (lc *lifecycle) hold(f *flight, pool, worker, class string, now time.Time) {
	f.pool, f.device, f.target, f.worker = pool, lc.env.device(pool), worker, ""
	lc.busy[pool]++
	lc.used[pool] = now
	lc.load.add(f.device, class, 1)
	if worker != "" {
		lc.workers.add(worker, class, 1)
		lc.sentSeq++
		lc.lastSent[worker] = lc.sentSeq
	}
	lc.active.see(f.device, class, now)
}

// release gives back what hold took: the attempt is over.
func (lc *lifecycle) release(f *flight, now time.Time) {
	lc.freed = true
	lc.busy[f.pool]--
	lc.used[f.pool] = now
	lc.load.add(f.device, f.p.class, -1)
	if f.target != "" {
		lc.workers.add(f.target, f.p.class, -1)
	}
	lc.active.see(f.device, f.p.class, now)
	if f.seq != 0 {
		delete(lc.bySeq, f.seq)
		f.seq = 0
	}
	lc.stopTimers(f)
	f.target = ""
}

// send is the rest of L2: the held flight's next attempt goes out, with its timers: the
// claim timer (L6) and the deadline timer (L8).
func (lc *lifecycle) send(f *flight, now time.Time) effect {
	f.attempt++
	f.state, f.sentAt, f.worker = stSent, now, ""
	f.direct = lc.env.replyDirect(f.p, f.pool)
	if !f.direct {
		lc.seq++
		f.seq = lc.seq
		lc.bySeq[f.seq] = f
	}
	lc.addTimer(f, now.Add(lc.claimTimeout), timerClaim)
	lc.addTimer(f, f.p.deadline.Add(answerGrace), timerDeadline)
	return effSend{p: f.p, pool: f.pool, target: f.target, attempt: f.attempt, direct: f.direct, seq: f.seq}
}

// out reports whether f has an attempt at a worker.
func (f *flight) out() bool { return f.state == stSent || f.state == stClaimed }

// claim is L3 and the direct half of L4: a claim counts only for the request's current
// attempt and pool. "taken" records the worker that holds it — the first worker to claim
// the attempt, and only one it may have reached (the worker it was sent to, or any of
// the pool's for its queue group); a taken claim with a reply subject (verdictTo: the
// claim of an item with reply_direct) is answered with the verdict, Own when that worker
// now holds the current attempt: only then may it answer the client (L3a; a claim that
// comes after the claim timer sent the request again is not Own, so the two attempts
// never both answer). "done" — its worker answered the client itself — ends it, when it
// comes from the worker it was sent to or the one that took it (or, sent to the pool's
// queue group and not claimed yet, any worker of the pool).
func (lc *lifecycle) claim(c codec.Claim, verdictTo string, now time.Time) []effect {
	f := lc.byID[c.ID]
	current := f != nil && f.out() && f.attempt == c.Attempt && f.pool == c.Pool
	switch {
	case c.State == codec.ClaimTaken:
		own := current && (f.target == "" || f.target == c.Worker) && (f.state == stSent || f.worker == c.Worker)
		if own {
			f.worker, f.state = c.Worker, stClaimed
		}
		if verdictTo == "" {
			return nil
		}
		return []effect{effVerdict{to: verdictTo, v: codec.ClaimVerdict{ID: c.ID, Attempt: c.Attempt, Own: own}}}
	case c.State == codec.ClaimDone && current:
		if !f.direct || !(c.Worker == f.target || c.Worker == f.worker || (f.target == "" && f.worker == "")) {
			return nil
		}
		lc.release(f, now)
		lc.forget(f)
		return []effect{effSettled{p: f.p, pool: f.pool, claim: c}}
	}
	return nil
}

// reply is the relayed half of L4: a worker's reply to the current attempt answers the
// client. A reply to an attempt that is over (retried, answered) is dropped.
func (lc *lifecycle) reply(seq uint64, msg *nats.Msg, now time.Time) []effect {
	f := lc.bySeq[seq]
	if f == nil || !f.out() {
		return nil
	}
	lc.release(f, now)
	lc.forget(f)
	return []effect{effRelay{p: f.p, pool: f.pool, msg: msg}}
}

// noResponders is L5: the server found no subscriber for the attempt's subject. While
// the pool has live workers (they resubscribe after a NATS restart) and time is left,
// the request waits noResponderBackoff out of the queue and is queued again; else it is
// answered no_worker.
func (lc *lifecycle) noResponders(seq uint64, subject string, now time.Time) []effect {
	f := lc.bySeq[seq]
	if f == nil || f.state != stSent {
		return nil
	}
	lc.release(f, now)
	if f.p.deadline.Sub(now) > noResponderMin && lc.env.hasLive(f.pool) {
		f.state = stBackoff
		lc.addTimer(f, now.Add(noResponderBackoff), timerBackoff)
		return nil
	}
	lc.forget(f)
	return []effect{answerErr(f.p, f.pool, codec.Errorf(codec.CodeNoWorker, "no worker is subscribed to %s", subject).With("pools", []string{f.pool}))}
}

// sendFailed is L5's other arm: the work item could not be encoded or published.
func (lc *lifecycle) sendFailed(id string, attempt int, e *codec.Error, now time.Time) []effect {
	f := lc.byID[id]
	if f == nil || !f.out() || f.attempt != attempt {
		return nil
	}
	lc.release(f, now)
	lc.forget(f)
	return []effect{answerErr(f.p, f.pool, e)}
}

// requeue puts f back at the front of its class queue (L5, L6, L7): a request that was
// already waiting goes before newer ones. One the client cancelled meanwhile is answered
// cancelled instead (L9).
func (lc *lifecycle) requeue(f *flight) []effect {
	if f.cancelAsked {
		lc.forget(f)
		return []effect{answerErr(f.p, f.pool, codec.Errorf(codec.CodeCancelled, "cancelled by the client while queued"))}
	}
	f.state, lc.freed = stQueued, true
	lc.queues.PushFront(&sched.Item{ID: f.p.id, Class: f.p.class, Pools: lc.env.retryPools(f.p), Deadline: f.p.deadline, Bytes: f.p.size, Value: f.p})
	return nil
}

// died is L7: worker of pool died (why); others is how many other live workers the pool
// has. It held the requests it claimed, those sent to it alone whose claim had not come,
// and, when the pool has no other live worker, those sent to the pool's queue group
// whose claim had not come. Each is retried once at the front of its class queue
// (inference is idempotent) while its deadline and a pool that can run it remain, else
// answered worker_lost; a request whose second holder dies is answered poison_input.
func (lc *lifecycle) died(pool, worker, why string, others int, now time.Time) []effect {
	lc.lastDeath[pool] = death{worker: worker, why: why, at: now}
	delete(lc.lastSent, worker)
	var out []effect
	for _, f := range lc.byID {
		if !f.out() || f.pool != pool {
			continue
		}
		unclaimed := f.state == stSent
		if f.worker == worker || (unclaimed && f.target == worker) || (unclaimed && f.target == "" && others == 0) {
			out = append(out, lc.lost(f, worker, why, now)...)
		}
	}
	return out
}

// lost ends f's attempt, whose holder worker died (L7).
func (lc *lifecycle) lost(f *flight, worker, why string, now time.Time) []effect {
	lc.release(f, now)
	f.deaths++
	if f.deaths >= 2 {
		lc.forget(f)
		return []effect{answerErr(f.p, f.pool, codec.Errorf(codec.CodePoisonInput, "two workers died holding this request (last: %s); not retried", worker).With("worker", worker))}
	}
	if now.After(f.p.deadline) || !lc.env.mayRun(lc.env.retryPools(f.p)) {
		lc.forget(f)
		return []effect{answerErr(f.p, f.pool, codec.Errorf(codec.CodeWorkerLost, "worker %s died holding this request (%s)", worker, why).With("worker", worker))}
	}
	return append([]effect{effRetried{f.p}}, lc.requeue(f)...)
}

// cancel is L9: a cancel of id sent by by (see canCancel). found reports whether an
// unanswered request with id exists that by may cancel. A queued (or backing off) one is
// answered cancelled; one at a worker gets a cancel sent to the workers, and the worker
// holding it answers it cancelled like any answer. A cancel of an unknown id is
// remembered for cancelMemory (bounded in total and per account), unless onlyKnown.
func (lc *lifecycle) cancel(id, by, account string, onlyKnown bool, now time.Time) (found bool, out []effect) {
	return lc.cancelWithin(id, by, account, onlyKnown, 0, now)
}

// cancelWithin is cancel for a canceller that waits at most within (0: no bound) for
// the answer (the job runner, jobs.go): a request at a worker that has not answered
// within it is answered cancelled then by its cancel timer (L9), its unit given back as
// at its deadline (L8).
func (lc *lifecycle) cancelWithin(id, by, account string, onlyKnown bool, within time.Duration, now time.Time) (found bool, out []effect) {
	f := lc.byID[id]
	if f == nil {
		if !onlyKnown {
			lc.rememberCancel(id, by, account, now)
		}
		return false, nil
	}
	if !canCancel(f.p.owner, by) {
		return false, nil // as if the id were unknown
	}
	switch f.state {
	case stQueued:
		lc.queues.Remove(id)
		fallthrough
	case stBackoff:
		lc.forget(f)
		return true, []effect{answerErr(f.p, f.pool, codec.Errorf(codec.CodeCancelled, "cancelled by the client while queued"))}
	}
	if within > 0 && f.cancelWithin == 0 {
		f.cancelWithin = within
		lc.addTimer(f, now.Add(within), timerCancel)
	}
	f.cancelAsked = true
	return true, []effect{effCancel{id: id, p: f.p}}
}

// rememberCancel keeps a cancel of an unknown id (L9, L1).
func (lc *lifecycle) rememberCancel(id, by, account string, now time.Time) {
	for k, c := range lc.early {
		if now.Sub(c.at) > cancelMemory {
			delete(lc.early, k)
		}
	}
	// Bounded in total, and per account (account.go, rule 5): one account's cancels of
	// made-up ids never crowd out another's.
	if len(lc.early) < maxEarlyCancels && (account == "" || lc.earlyOf(account) < accountBound(maxEarlyCancels)) {
		lc.early[id] = earlyCancel{at: now, by: by, account: account}
	}
}

// earlyOf is how many early cancels account has remembered.
func (lc *lifecycle) earlyOf(account string) int {
	n := 0
	for _, c := range lc.early {
		if c.account == account {
			n++
		}
	}
	return n
}

// tick fires the timers due at now: L6 (no claim), L8 (deadline), L5 (backoff over), L9
// (a bounded cancel not confirmed). A timer of an attempt that is over is dropped.
func (lc *lifecycle) tick(now time.Time) []effect {
	var out []effect
	for len(lc.timers) > 0 && !lc.timers[0].at.After(now) {
		t := heap.Pop(&lc.timers).(*timer)
		f := t.f
		if lc.byID[f.p.id] != f || f.attempt != t.attempt {
			continue
		}
		switch {
		case t.kind == timerClaim && f.state == stSent:
			out = append(out, lc.unclaimed(f, now)...)
		case t.kind == timerDeadline && f.out():
			lc.release(f, now)
			lc.forget(f)
			out = append(out, answerErr(f.p, f.pool, codec.Errorf(codec.CodeDeadlineExceeded, "no answer from pool %s before the deadline", f.pool)))
		case t.kind == timerBackoff && f.state == stBackoff:
			out = append(out, lc.requeue(f)...)
		case t.kind == timerCancel && f.out():
			lc.release(f, now)
			lc.forget(f)
			out = append(out, answerErr(f.p, f.pool, codec.Errorf(codec.CodeCancelled, "cancelled; its worker did not confirm within %s", f.cancelWithin)))
		}
	}
	return out
}

// unclaimed is L6: no claim came for the attempt within claimTimeout. A worker claims an
// item the moment it receives it, so an unclaimed one was delivered to a worker that is
// gone (a dead worker's subscription lingers in the server until it notices the death):
// it is queued again at the front, and that is no worker's death. But when a worker of
// the pool died after the send, the request is taken as held by it (a worker that
// crashes at once may die before its claim leaves it): L7.
func (lc *lifecycle) unclaimed(f *flight, now time.Time) []effect {
	if d, ok := lc.lastDeath[f.pool]; ok && d.at.After(f.sentAt) {
		return lc.lost(f, d.worker, d.why+" (before its claim was sent)", now)
	}
	pool := f.pool
	lc.release(f, now)
	if !now.Before(f.p.deadline) {
		lc.forget(f)
		return []effect{answerErr(f.p, pool, codec.Errorf(codec.CodeDeadlineExceeded, "deadline passed before a worker took the request"))}
	}
	return append([]effect{effUnclaimed{p: f.p, pool: pool}}, lc.requeue(f)...)
}

// shutdown is L10: the queued (and backing off) requests are answered no_worker, and,
// with inFlight, those at workers too (worker_lost).
func (lc *lifecycle) shutdown(inFlight bool, now time.Time) []effect {
	var out []effect
	for _, it := range lc.queues.Drain() {
		if f := lc.byID[it.ID]; f != nil {
			lc.forget(f)
			out = append(out, answerErr(f.p, "", codec.Errorf(codec.CodeNoWorker, "gateway shut down before the request was dispatched")))
		}
	}
	for _, f := range lc.byID {
		switch {
		case f.state == stBackoff || f.state == stQueued:
			lc.forget(f)
			out = append(out, answerErr(f.p, f.pool, codec.Errorf(codec.CodeNoWorker, "gateway shut down before the request was dispatched")))
		case inFlight:
			lc.release(f, now)
			lc.forget(f)
			out = append(out, answerErr(f.p, f.pool, codec.Errorf(codec.CodeWorkerLost, "gateway shut down while the request was in flight")))
		}
	}
	return out
}

// Queries of the loop's state (read by the loop, or through an inspect event).

// get returns the unanswered request with id.
func (lc *lifecycle) get(id string) (*pending, bool) {
	f, ok := lc.byID[id]
	if !ok {
		return nil, false
	}
	return f.p, true
}

// count is the number of unanswered requests.
func (lc *lifecycle) count() int { return len(lc.byID) }

// inFlight is the number of requests dispatched to pool and not yet back.
func (lc *lifecycle) inFlight(pool string) int { return lc.busy[pool] }

// idleSince reports when pool last had a request back, if none is in flight now (ok
// false while one is, or when it never had one).
func (lc *lifecycle) idleSince(pool string) (time.Time, bool) {
	t, ok := lc.used[pool]
	return t, ok && lc.busy[pool] == 0
}

// running counts the requests at workers by class.
func (lc *lifecycle) running() map[string]int {
	out := map[string]int{}
	for _, f := range lc.byID {
		if f.out() {
			out[f.p.class]++
		}
	}
	return out
}

// heldNow is a copy of what is in flight: requests per pool, per device and class, and
// per worker and class, when each worker was last given one, and when each class was
// last active on each device.
type heldNow struct {
	busy     map[string]int
	load     classCounts
	workers  classCounts
	lastSent map[string]uint64
	active   lastActive
}

// held is a copy of what is in flight now, for a capacity snapshot (which counts the
// units its pass takes in its own copy).
func (lc *lifecycle) held() heldNow {
	return heldNow{busy: maps.Clone(lc.busy), load: lc.load.clone(), workers: lc.workers.clone(), lastSent: maps.Clone(lc.lastSent), active: lc.active.clone()}
}

// timers of attempts, in a heap by time. A flight's timers leave the heap when its
// attempt is over (release) or it is answered (forget), so the heap holds no answered
// request however long its deadline.
type timerKind int

const (
	timerClaim timerKind = iota
	timerDeadline
	timerBackoff
	timerCancel
)

type timer struct {
	at      time.Time
	f       *flight
	attempt int
	kind    timerKind
	index   int // in the heap; -1 once out
}

type timerHeap []*timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*timer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}

// addTimer sets a timer of kind for f's current attempt at at.
func (lc *lifecycle) addTimer(f *flight, at time.Time, kind timerKind) {
	t := &timer{at: at, f: f, attempt: f.attempt, kind: kind}
	heap.Push(&lc.timers, t)
	f.timers = append(f.timers, t)
}

// stopTimers takes f's timers out of the heap.
func (lc *lifecycle) stopTimers(f *flight) {
	for _, t := range f.timers {
		if t.index >= 0 {
			heap.Remove(&lc.timers, t.index)
		}
	}
	f.timers = f.timers[:0]
}

// decision is where route sends an item: to pool (its unit taken in the snapshot), or
// nowhere yet (pool ""): it waits, or fails with err. wake names a lazy_load pool to start
// for it.
type decision struct {
	pool   string
	worker string // the worker of pool it is sent to ("" for the pool's queue group)
	err    error
	wake   string
	// reserve: the item waits, and its class reserves its pools' devices while it does.
	reserve bool
	// own: the item's pools its owner's own pause alone holds it from (pause.go, rule 5).
	// While it waits it holds only its other pools (sched.Waits) and their devices: none
	// of these from anyone else's work.
	own map[string]bool
}

// Events: what the rest of the gateway tells the loop.
type (
	event interface{ isEvent() }
	// evAccept: a request decoded, validated and resolved to pools (L1).
	evAccept struct {
		p     *pending
		pools []string
	}
	// evClaim: a worker's claim, checked against its subject (L3, L4), and the subject
	// its verdict goes to ("" when it asks for none).
	evClaim struct {
		c         codec.Claim
		verdictTo string
	}
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
		id, by, account string
		onlyKnown       bool          // an unknown id is not remembered
		within          time.Duration // the canceller waits this long for the answer (0: no bound)
		found           chan<- bool
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

func (evAccept) isEvent() {}

func (evClaim) isEvent() {}

func (evReply) isEvent() {}

func (evDied) isEvent() {}

func (evCancel) isEvent() {}

func (evShutdown) isEvent() {}

func (evInspect) isEvent() {}

func (evDrained) isEvent() {}
