package gateway

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// Waiting leases: an acquire with wait_ms that its device's budget cannot hold now
// (lease.go, rule 1) waits in the gateway, and is granted on the event that makes room,
// never by its client asking again.
//
//  1. Order: the waiters are tried in their class's priority (under the configuration in
//     force at each pass), then in arrival order.
//  2. Held back: nothing takes room that a waiter before it waits for. At a pass, once a
//     waiter does not fit on its device, the waiters after it on that device are not
//     tried (they are of its class or a lower one: rule 1); a new acquire on a device
//     where a waiter of its class or a higher one waits is refused overloaded (or waits,
//     with wait_ms), naming that waiter's class. A new acquire of a class above every
//     waiter of its device is decided at once.
//  3. Woken: a pass over the waiters runs at every event that can make room — a lease
//     released, a pressed lease shrunk (press.go), a worker's heartbeat or death (its
//     memory lower, a pool stopped: the tracker's change), a reading of the devices'
//     foreign memory that drops (foreign.go), a configuration change (a reload may raise
//     a capacity), a new waiter — and at the next lease expiry while one waits. A
//     waiter that does not fit presses the reclaimable leases of lower classes on its
//     device (lease.go, rule 6), at each pass.
//  4. Bounded: maxLeaseWaiters wait at once, accountBound of them of one account other than
//     the local owner; past that the acquire is refused overloaded (details limit).
//  5. Each waiter is answered exactly once: granted (the lease); wait_ms passed
//     (overloaded: its last refusal, with waited_ms); refused otherwise at a pass (its
//     device or class gone with a reload: that error); or the gateway stopping
//     (unavailable). A waiter whose client went away meanwhile may still be granted: that
//     lease lapses after its ttl, as any lease not renewed.
//
// leaseWaits owns the queue of waiting acquires, under its lock. What a waiter's try is
// (an acquire under the configuration of the pass) its composer (budget.go) hands to
// each pass.
type leaseWaits struct {
	log     *slog.Logger
	mu      sync.Mutex
	q       []*leaseWaiter // in arrival order; a pass sorts its own copy (rule 1)
	seq     uint64
	stopped bool
	wakeCh  chan struct{} // a pass soon (cap 1: wakes coalesce)
}

// leaseWaiter is one waiting acquire.
type leaseWaiter struct {
	req     codec.LeaseRequest // its class filled in
	account string
	seq     uint64
	since   time.Time
	last    *codec.Error // its last refusal
	answer  leaseAnswer
	timer   *time.Timer
}

// leaseAnswer delivers the one answer of a lease request.
type leaseAnswer func(*codec.LeaseReply, *codec.Error)

// maxLeaseWaiters bounds the acquires waiting at once (rule 4).
const maxLeaseWaiters = 256

func newLeaseWaits(log *slog.Logger) *leaseWaits {
	return &leaseWaits{log: log, wakeCh: make(chan struct{}, 1)}
}

// wake asks for a pass over the waiters (rule 3); it never blocks.
func (w *leaseWaits) wake() {
	select {
	case w.wakeCh <- struct{}{}:
	default:
	}
}

// add queues an acquire refused with refusal, to be answered through answer (rules 4,
// 5); the error is its refusal when it cannot wait.
func (w *leaseWaits) add(req *codec.LeaseRequest, account string, refusal *codec.Error, answer leaseAnswer) *codec.Error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return codec.Errorf(codec.CodeUnavailable, "the gateway is stopping")
	}
	if len(w.q) >= maxLeaseWaiters {
		return codec.Errorf(codec.CodeOverloaded, "%d lease acquires are waiting, this gateway's bound; %s", len(w.q), refusal.Message).With("limit", maxLeaseWaiters)
	}
	if account != "" {
		n := 0
		for _, x := range w.q {
			if x.account == account {
				n++
			}
		}
		if n >= accountBound(maxLeaseWaiters) {
			return codec.Errorf(codec.CodeOverloaded, "%d of your lease acquires are waiting, this gateway's bound for one owner; %s", n, refusal.Message).With("limit", accountBound(maxLeaseWaiters))
		}
	}
	w.seq++
	x := &leaseWaiter{req: *req, account: account, seq: w.seq, since: time.Now(), last: refusal, answer: answer}
	if x.req.Class == "" {
		x.req.Class = subjects.ClassInteractive
	}
	x.timer = time.AfterFunc(time.Duration(req.WaitMS)*time.Millisecond, func() { w.timeout(x) })
	w.q = append(w.q, x)
	// A room made between the refusal and now woke no pass for this waiter: one now.
	w.wake()
	return nil
}

// take removes x from the queue: false when it was not there (answered already). w.mu held.
func (w *leaseWaits) take(x *leaseWaiter) bool {
	i := slices.Index(w.q, x)
	if i < 0 {
		return false
	}
	w.q = slices.Delete(w.q, i, i+1)
	x.timer.Stop()
	return true
}

// timeout answers x, its wait_ms passed, with its last refusal (rule 5).
func (w *leaseWaits) timeout(x *leaseWaiter) {
	w.mu.Lock()
	ok := w.take(x)
	e := *x.last
	w.mu.Unlock()
	if !ok {
		return
	}
	waited := time.Since(x.since).Milliseconds()
	e.Details = cloneDetails(e.Details)
	e.Message = "waited " + time.Duration(waited*int64(time.Millisecond)).String() + " for room: " + e.Message
	x.answer(nil, e.With("waited_ms", waited))
}

// cloneDetails copies an error's details, so that a copy of the error may add its own.
func cloneDetails(d map[string]any) map[string]any {
	out := make(map[string]any, len(d)+1)
	for k, v := range d {
		out[k] = v
	}
	return out
}

// stop answers every waiter unavailable, and every acquire that would wait from now on
// (rule 5).
func (w *leaseWaits) stop() {
	w.mu.Lock()
	q := w.q
	w.q, w.stopped = nil, true
	for _, x := range q {
		x.timer.Stop()
	}
	w.mu.Unlock()
	for _, x := range q {
		x.answer(nil, codec.Errorf(codec.CodeUnavailable, "the gateway is stopping; acquire again from another"))
	}
}

// heldBack refuses an acquire that would take room a waiter of its device, of its class
// or a higher one, waits for (rule 2); nil when none waits. The priorities are c's.
func (w *leaseWaits) heldBack(c *config.Config, req *codec.LeaseRequest) *codec.Error {
	class := cmp.Or(req.Class, subjects.ClassInteractive)
	prio := classPriority(c, class)
	if prio < 0 {
		return nil // an unknown class: the acquire's own refusal
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.q {
		if p := classPriority(c, x.req.Class); x.req.Device == req.Device && p >= 0 && p <= prio {
			return codec.Errorf(codec.CodeOverloaded, "held back: a lease of class %s waits for the memory of device %s, and comes before this one of class %s",
				x.req.Class, req.Device, class).With("device", req.Device).With("waiting_class", x.req.Class)
		}
	}
	return nil
}

// pass is one pass over the waiters under c (rules 1 to 3): each is tried in order
// (try: an acquire under c), granted if its device's budget holds it, held back behind a
// waiter of its device that does not fit. The answers go out after the queue's lock is
// released.
func (w *leaseWaits) pass(c *config.Config, try func(req *codec.LeaseRequest, account string) (*codec.LeaseReply, *codec.Error)) {
	type answered struct {
		x *leaseWaiter
		l *codec.LeaseReply
		e *codec.Error
	}
	var out []answered
	w.mu.Lock()
	order := slices.Clone(w.q)
	slices.SortStableFunc(order, func(a, b *leaseWaiter) int {
		return cmp.Or(cmp.Compare(waitPriority(c, a), waitPriority(c, b)), cmp.Compare(a.seq, b.seq))
	})
	blocked := map[string]bool{}
	for _, x := range order {
		if blocked[x.req.Device] {
			continue
		}
		// Tried and granted under the queue's lock: a waiter that times out meanwhile
		// is answered once, its lease never granted behind its back.
		l, e := try(&x.req, x.account)
		if e != nil && e.Code == codec.CodeOverloaded {
			x.last = e
			blocked[x.req.Device] = true
			continue
		}
		w.take(x)
		out = append(out, answered{x, l, e})
	}
	w.mu.Unlock()
	for _, a := range out {
		if a.e == nil {
			w.log.Info("waiting lease granted", "device", a.l.Device, "bytes", a.l.Bytes, "class", a.l.Class, "holder", a.l.Holder, "waited", time.Since(a.x.since))
		}
		a.x.answer(a.l, a.e)
	}
}

// waitPriority is x's class's priority under c; a class c no longer has comes last (its
// acquire is then refused).
func waitPriority(c *config.Config, x *leaseWaiter) int {
	if p := classPriority(c, x.req.Class); p >= 0 {
		return p
	}
	return int(^uint(0) >> 1)
}

// waiting is how many acquires wait.
func (w *leaseWaits) waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.q)
}

// run runs pass (one over the waiting acquires) at every wake (rule 3), and at the next
// lease expiry (expiry: how long until it) while an acquire waits, until the returned
// stop is called; stop answers the waiters left (rule 5).
func (w *leaseWaits) run(pass func(), expiry func() time.Duration) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for {
			select {
			case <-done:
				return
			case <-w.wakeCh:
			case <-timer.C:
			}
			pass()
			if w.waiting() == 0 {
				timer.Reset(time.Hour)
			} else {
				timer.Reset(expiry())
			}
		}
	}()
	return func() { close(done); <-exited; w.stop() }
}
