package worker

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// verdicts holds the replies that go straight to a client until the gateway that
// dispatched them says they may. Its rules:
//
//  1. An item with reply_direct and a claim subject is claimed with a reply subject, the
//     worker's verdict subject (subjects.VerbVerdict); its reply goes to the client only
//     once the gateway's codec.ClaimVerdict for its id and attempt says Own — never
//     before, never without. The gateway dispatches a request again when no claim came
//     in time (a worker slow to claim on a loaded machine looks like a dead one): without
//     this rule both attempts would answer the client.
//  2. Not Own: the job's context is cancelled (queued or running, it stops) and its reply
//     is dropped, with no done claim; counted (dropped).
//  3. A reply ready before its verdict is parked. Parked replies are bounded (maxParked,
//     maxParkedBytes); one past the bound, or whose verdict has not come verdictGrace
//     past its deadline, is dropped and counted: the gateway answers the request
//     (deadline_exceeded), so it still has exactly one answer.
//  4. A verdict of an id and attempt the worker does not wait for (late, forged, a
//     repeat) changes nothing.
type verdicts struct {
	mu          sync.Mutex
	waiting     map[verdictKey]*verdictWait // jobs whose verdict has not come
	parked      int                         // of them, those whose reply is ready (rule 3)
	parkedBytes int
	unparked    chan struct{} // signalled when a parked reply leaves (waitParked)
	grace       time.Duration // verdictGrace (tests: shorter)

	dropped atomic.Uint64 // replies dropped: not own, or no verdict in time (rules 2, 3)
}

// verdictKey names one attempt of a request.
type verdictKey struct {
	id      string
	attempt int
}

// verdictWait is one job's wait for its verdict. Under verdicts.mu.
type verdictWait struct {
	key      verdictKey
	own      int8        // 0 not known yet, verdictOwn, verdictNotOwn
	cancel   func()      // the job's context's cancel (rule 2)
	deadline time.Time   // the job's (zero: none was set)
	send     func()      // its parked reply's sending (rule 3), nil until it is ready
	bytes    int         // the parked reply's size
	expiry   *time.Timer // drops the parked reply (rule 3)
}

const (
	verdictOwn    int8 = 1
	verdictNotOwn int8 = -1
)

// The bounds of parked replies (rule 3).
const (
	maxParked      = 1024
	maxParkedBytes = 64 << 20
	// verdictGrace: a parked reply waits this long past its deadline; the gateway answers
	// deadline_exceeded a second past it (its answerGrace).
	verdictGrace = time.Second
)

func newVerdicts() *verdicts {
	return &verdicts{waiting: map[verdictKey]*verdictWait{}, unparked: make(chan struct{}, 1), grace: verdictGrace}
}

// expect registers the wait for the verdict on attempt of request id (rule 1), before its
// claim is sent: cancel stops its job, deadline is the job's (zero: none).
func (v *verdicts) expect(id string, attempt int, cancel func(), deadline time.Time) *verdictWait {
	w := &verdictWait{key: verdictKey{id, attempt}, cancel: cancel, deadline: deadline}
	v.mu.Lock()
	v.waiting[w.key] = w
	v.mu.Unlock()
	return w
}

// deliver sends a reply of a job that waits for its verdict: now (own), parked until the
// verdict comes (rule 3), or never (not own: rule 2). size is the reply's size.
func (v *verdicts) deliver(w *verdictWait, size int, send func()) {
	v.mu.Lock()
	switch {
	case w.own == verdictOwn:
		v.mu.Unlock()
		send()
		return
	case w.own == verdictNotOwn:
	case v.parked < maxParked && v.parkedBytes+size <= maxParkedBytes:
		w.send, w.bytes = send, size
		v.parked++
		v.parkedBytes += size
		w.expiry = time.AfterFunc(max(time.Until(w.deadline), 0)+v.grace, func() { v.expire(w) })
		v.mu.Unlock()
		return
	default:
		delete(v.waiting, w.key)
	}
	v.mu.Unlock()
	v.dropped.Add(1)
}

// decide applies the gateway's verdict c (rules 1, 2 and 4).
func (v *verdicts) decide(c codec.ClaimVerdict) {
	v.mu.Lock()
	w := v.waiting[verdictKey{c.ID, c.Attempt}]
	if w == nil {
		v.mu.Unlock()
		return
	}
	delete(v.waiting, w.key)
	w.own = verdictNotOwn
	if c.Own {
		w.own = verdictOwn
	}
	send := w.send
	if send != nil {
		v.unparkLocked(w)
	}
	v.mu.Unlock()
	switch {
	case c.Own && send != nil:
		send()
	case !c.Own:
		if w.cancel != nil {
			w.cancel() // queued or running, it stops; its answer is dropped (deliver)
		}
		if send != nil {
			v.dropped.Add(1)
		}
	}
}

// expire drops w's parked reply, its verdict not come in time (rule 3).
func (v *verdicts) expire(w *verdictWait) {
	v.mu.Lock()
	parked := w.send != nil && v.waiting[w.key] == w
	if parked {
		delete(v.waiting, w.key)
		v.unparkLocked(w)
	}
	v.mu.Unlock()
	if parked {
		v.dropped.Add(1)
	}
}

// unparkLocked takes w's parked reply out of the bounds. Under mu.
func (v *verdicts) unparkLocked(w *verdictWait) {
	w.expiry.Stop()
	v.parked--
	v.parkedBytes -= w.bytes
	w.send = nil
	select {
	case v.unparked <- struct{}{}:
	default:
	}
}

// parkedDrainWait bounds how long a draining worker waits for the verdicts of its parked
// replies (they come within a bus round trip of the claim).
const parkedDrainWait = 2 * time.Second

// waitParked returns once no reply is parked, or after within: a draining worker's
// parked replies get their verdicts before it stops listening for them.
func (v *verdicts) waitParked(within time.Duration) {
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		v.mu.Lock()
		n := v.parked
		v.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-v.unparked:
		case <-timeout.C:
			return
		}
	}
}
