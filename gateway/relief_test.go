package gateway

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// Relief (relief.go), in process on cuda:0 with a fake reader of its processes: a
// reclaimable lease of 800 MiB pressed by an urgent waiter and shrunk to its holder's 100
// MiB is not given its bytes back while it is pressed, while it settles, while the urgent
// lease holds the room, while an acquire waits on the device, or while a worker starts
// there; once the urgent lease is released it is grown back to its 800 MiB (never above
// what its acquire was granted) and the reply says relief; a renew without bytes never
// does.
func TestRelief(t *testing.T) {
	g, _, fake, _ := foreignGateway(t)
	pid := holderProc(t)
	held := reclaimable(t, g, "cuda:0", 800*mib, pid)
	fake.set(map[int]int64{pid: 800 * mib}, nil)
	g.budget.foreign.poll(g.conf())
	t.Cleanup(g.budget.startWaits(g.conf))
	t.Cleanup(g.budget.presser.start(g.conf))
	var now atomic.Int64 // how far the leases' clock is moved on
	leaseNow = func() time.Time { return time.Now().Add(time.Duration(now.Load())) }
	t.Cleanup(func() { leaseNow = time.Now })
	relief := func(what string, bytes int64) *codec.LeaseReply {
		t.Helper()
		r, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: held.Lease, TTLMS: 600000, Bytes: bytes})
		if e != nil {
			t.Fatalf("%s: %v", what, e)
		}
		return r
	}
	refused := func(what string, wantBytes int64) {
		t.Helper()
		if r := relief(what, 800*mib); r.Relief || r.Bytes != wantBytes {
			t.Errorf("%s: relief %v at %d MiB, want none, the lease at %d MiB", what, r.Relief, r.Bytes>>20, wantBytes>>20)
		}
	}

	rec := newWaitRecorder(g)
	rec.send("urgent", "", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 300 * mib, Class: "urgent", TTLMS: 600000, WaitMS: 60000})
	refused("pressed, the urgent acquire waiting", 800*mib)
	fake.set(map[int]int64{pid: 100 * mib}, nil) // the holder gives its memory back
	urgent := rec.next(t)
	if urgent.e != nil {
		t.Fatalf("the urgent waiter: %v", urgent.e)
	}
	refused("settling", 100*mib)
	now.Store(int64(2 * pressSettle))
	refused("the urgent lease holding the room", 100*mib)

	if _, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRelease, Lease: urgent.l.Lease}); e != nil {
		t.Fatal(e)
	}
	// A batch waiter (it presses no lease of its own class) that can never fit, waiting
	// 200 ms: its wait's end is its answer.
	rec.send("waiter", "", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 2000 * mib, Class: "batch", TTLMS: 600000, WaitMS: 200})
	refused("an acquire waiting on the device", 100*mib)
	if a := rec.next(t); a.name != "waiter" || a.e == nil || a.e.Code != codec.CodeOverloaded {
		t.Fatalf("the waiter: %+v", a)
	}
	g.budget.starting = func(device string) bool { return device == "cuda:0" }
	refused("a worker starting on the device", 100*mib)
	g.budget.starting = nil

	if r, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: held.Lease, TTLMS: 600000}); e != nil || r.Relief || r.Bytes != 100*mib {
		t.Errorf("a plain renew: %+v %v, want no relief and the lease as it is", r, e)
	}
	if r := relief("nothing pressing any more", 2000*mib); !r.Relief || r.Bytes != 800*mib {
		t.Errorf("relief %v at %d MiB, want relief at the acquire's 800 MiB", r.Relief, r.Bytes>>20)
	}
	if l := leaseOn(t, g, "cuda:0", "holder"); l.Bytes != 800*mib || l.Relief {
		t.Errorf("the lease in status after the relief: %+v", l)
	}
}
