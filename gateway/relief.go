package gateway

import (
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// Relief: the way back from a press (lease.go, rule 6). A reclaimable lease shrunk for a
// higher class's work stays shrunk until its holder asks for its memory back: a renew that
// carries bytes (the wrapper's --on-relief: codec.LeaseRequest.Bytes on a renew).
//
//  1. Nothing presses the device any more: no lease on it is pressed or settling (rule
//     6), no acquire waits on it (leasewait.go: the work a press made room for may still
//     be on its way), and no local worker of a pool on it is starting (supervise.go: a
//     pool woken for the memory takes it only once its worker has loaded and is heard).
//  2. The device's budget holds the lease at the bytes asked — at most its acquire's —
//     beside what is admitted, leased, foreign and reserved against its class (rule 1),
//     decided under the table's lock as a grant is.
//  3. Then the lease is grown back to those bytes and the reply says relief: its holder
//     may take its memory again (the wrapper runs its on-relief hook). Otherwise the renew
//     is a plain renew: the lease keeps its bytes, relief false, and the holder asks
//     again later.

// startingOn reports whether a local worker of a pool on device is starting (wired to the
// supervisor's startingOn; nil: none ever is).
type startingOn func(device string) bool

// renewRelief answers a renew of account that carries bytes: the renew, and relief when
// rules 1 and 2 hold, under c.
func (b *memoryBudget) renewRelief(c *config.Config, req *codec.LeaseRequest, account string, ttl time.Duration, now time.Time) (*codec.LeaseReply, *codec.Error) {
	r, e := b.leases.renewOrRelease(req, account, ttl, now)
	if e != nil || req.Bytes <= 0 {
		return r, e
	}
	if b.leases.busyOn(r.Device, now) || b.waits.waitingOn(r.Device) || (b.starting != nil && b.starting(r.Device)) {
		return r, nil // rule 1: still pressed
	}
	p := b.admission.plan(c, r.Device, "", classPriority(c, r.Class))
	p.measured = b.foreign.latest(r.Device)
	relieved, ok := b.leases.relieve(req.Lease, req.Bytes, now, func(leased, grow int64) *codec.Error {
		p.leased = leased
		return p.leaseRefusal(grow)
	})
	if !ok {
		return r, nil
	}
	if relieved.Bytes > r.Bytes {
		b.log.Info("relieved lease grown back", "device", relieved.Device, "holder", relieved.Holder, "class", relieved.Class, "from", r.Bytes, "bytes", relieved.Bytes)
	}
	return relieved, nil
}

// busyOn reports whether a lease on device is pressed or settling at now (rule 6).
func (l *leases) busyOn(device string, now time.Time) bool {
	return l.anyLease(now, func(x *lease) bool { return x.Device == device && x.measured(now) })
}

// relieve grows the lease id back to want bytes (at most its acquire's) when it is not
// measured (pressed or settling) and fits, given the bytes leased on its device now and
// the growth, finds room for it (rule 2); ok false when it is gone, measured, or does not
// fit. The reply has Relief set.
func (l *leases) relieve(id string, want int64, now time.Time, fits func(leased, grow int64) *codec.Error) (r *codec.LeaseReply, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	x, found := l.by[id]
	if !found || x.measured(now) {
		return nil, false
	}
	want = min(want, x.granted)
	if grow := want - x.Bytes; grow > 0 {
		var leased int64
		for _, y := range l.by {
			if y.Device == x.Device {
				leased += y.Bytes
			}
		}
		if fits(leased, grow) != nil {
			return nil, false
		}
		x.Bytes = want
	}
	c := x.LeaseReply
	c.Relief = true
	return &c, true
}

// waitingOn reports whether an acquire waits on device (rule 1).
func (w *leaseWaits) waitingOn(device string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.q {
		if x.req.Device == device {
			return true
		}
	}
	return false
}
