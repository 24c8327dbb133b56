package gateway

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// Waiting leases (leasewait.go), in process: the admissionConfig's cuda:0 (1 GiB × 0.85,
// 870.4 MiB), no network. The passes are driven by hand (grantWaiting) where the order is
// checked, and by the runner (startWaits) where the events that wake it are.

// leaseAnswered is one answer of a waiting lease request.
type leaseAnswered struct {
	name string
	l    *codec.LeaseReply
	e    *codec.Error
}

// waitRecorder collects the answers of the lease requests it sends, in the order they
// are given.
type waitRecorder struct {
	g   *Gateway
	mu  sync.Mutex
	all []leaseAnswered
	got chan leaseAnswered
}

func newWaitRecorder(g *Gateway) *waitRecorder {
	return &waitRecorder{g: g, got: make(chan leaseAnswered, 1024)}
}

// send serves one lease request of account, named name, as the API does.
func (r *waitRecorder) send(name, account string, req *codec.LeaseRequest) {
	r.g.budget.serveLease(r.g.conf(), req, account, func(l *codec.LeaseReply, e *codec.Error) {
		a := leaseAnswered{name, l, e}
		r.mu.Lock()
		r.all = append(r.all, a)
		r.mu.Unlock()
		r.got <- a
	})
}

// wait sends an acquire of class and bytes on cuda:0 that waits up to a minute.
func (r *waitRecorder) wait(name, class string, bytes int64) {
	r.send(name, "", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: bytes, Class: class, TTLMS: 600000, Holder: name, WaitMS: 60000})
}

// answers are the answers so far, by name, in order.
func (r *waitRecorder) answers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, a := range r.all {
		s := a.name
		if a.e != nil {
			s += ":" + string(a.e.Code)
		}
		out = append(out, s)
	}
	return out
}

// next waits for the next answer (bounding a failure only).
func (r *waitRecorder) next(t *testing.T) leaseAnswered {
	t.Helper()
	select {
	case a := <-r.got:
		return a
	case <-time.After(30 * time.Second):
		t.Fatalf("no answer; so far %v", r.answers())
		return leaseAnswered{}
	}
}

// hog takes what of cuda:0 the test says, as a plain lease of the local owner.
func hog(t *testing.T, g *Gateway, bytes, ttlMS int64) *codec.LeaseReply {
	t.Helper()
	l, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: bytes, Class: "batch", TTLMS: ttlMS, Holder: "hog"})
	if e != nil {
		t.Fatal(e)
	}
	return l
}

func release(t *testing.T, g *Gateway, l *codec.LeaseReply) {
	t.Helper()
	if _, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRelease, Lease: l.Lease}); e != nil {
		t.Fatal(e)
	}
}

// Rules 1 and 2: waiters are granted by class, then in arrival order; one that would fit
// but comes after a waiter of its class that does not is held back, at its arrival and at
// each pass; a new acquire behind a waiter of its class is refused naming it, one on
// another device is not held back. Each waiter is answered once.
func TestLeaseWaitOrder(t *testing.T) {
	g := testGateway(t, admissionConfig)
	r := newWaitRecorder(g)
	h := hog(t, g, 800*mib, 600000)
	r.wait("batch-300", "batch", 300*mib)
	r.wait("urgent-300", "urgent", 300*mib)
	r.wait("interactive-300", "interactive", 300*mib)
	r.wait("urgent-10", "urgent", 10*mib) // fits beside the hog, but urgent-300 came first
	if got := r.answers(); len(got) != 0 {
		t.Fatalf("answered before any room: %v", got)
	}
	_, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 10 * mib, Class: "urgent"})
	if e == nil || e.Code != codec.CodeOverloaded || e.Details["waiting_class"] != "urgent" || e.Details["device"] != "cuda:0" {
		t.Errorf("an urgent acquire behind urgent waiters: %v %v, want overloaded naming the waiting class", e, e.Details)
	}
	if _, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "gpu.intel:0", Bytes: 10 * mib, Class: "batch"}); e != nil {
		t.Errorf("an acquire on another device: %v, want granted", e)
	}
	g.budget.grantWaiting(g.conf())
	if got := r.answers(); len(got) != 0 {
		t.Fatalf("a pass with no room granted %v", got)
	}

	release(t, g, h)
	g.budget.grantWaiting(g.conf())
	// 300 + 10 + 300 = 610 MiB granted; batch's 300 more would pass 870.4.
	want := []string{"urgent-300", "urgent-10", "interactive-300"}
	if got := r.answers(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("granted %v, want %v", got, want)
	}
	var interactive *codec.LeaseReply
	for range want {
		if a := r.next(t); a.name == "interactive-300" {
			interactive = a.l
		}
	}
	if interactive == nil || interactive.Lease == "" || interactive.Bytes != 300*mib || interactive.Class != "interactive" || interactive.Holder != "interactive-300" {
		t.Fatalf("interactive's grant: %+v", interactive)
	}
	release(t, g, interactive)
	g.budget.grantWaiting(g.conf())
	if a := r.next(t); a.name != "batch-300" || a.e != nil {
		t.Fatalf("after interactive's release: %+v, want batch-300 granted", a)
	}
	g.budget.grantWaiting(g.conf())
	if n := len(r.answers()); n != 4 || g.budget.waits.waiting() != 0 {
		t.Errorf("%d answers, %d still waiting; want each waiter answered once", n, g.budget.waits.waiting())
	}
}

// Rule 2 at a pass: a batch waiter that fits is not granted while an urgent one before it
// on its device does not fit.
func TestLeaseWaitHeldBack(t *testing.T) {
	g := testGateway(t, admissionConfig)
	r := newWaitRecorder(g)
	h := hog(t, g, 800*mib, 600000)
	r.wait("urgent-100", "urgent", 100*mib)
	r.wait("batch-50", "batch", 50*mib) // 850 MiB would fit
	g.budget.grantWaiting(g.conf())
	if got := r.answers(); len(got) != 0 {
		t.Fatalf("granted %v while urgent-100 waits for room", got)
	}
	release(t, g, h)
	g.budget.grantWaiting(g.conf())
	if got := r.answers(); fmt.Sprint(got) != "[urgent-100 batch-50]" {
		t.Errorf("granted %v, want urgent-100 then batch-50", got)
	}
}

// Rule 5: a waiter whose wait_ms passes is answered overloaded once, with its refusal's
// figures and how long it waited; room made later grants it nothing.
func TestLeaseWaitTimeout(t *testing.T) {
	g := testGateway(t, admissionConfig)
	r := newWaitRecorder(g)
	h := hog(t, g, 800*mib, 600000)
	r.send("short", "", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 100 * mib, Class: "urgent", WaitMS: 1})
	a := r.next(t)
	if a.e == nil || a.e.Code != codec.CodeOverloaded || a.e.Details["waited_ms"] == nil || a.e.Details["budget_bytes"] != int64(cudaBudget) || a.e.Details["device"] != "cuda:0" {
		t.Fatalf("timed out: %v %v, want overloaded with the figures and waited_ms", a.e, a.e.Details)
	}
	if g.budget.waits.waiting() != 0 {
		t.Error("a timed-out waiter still waits")
	}
	release(t, g, h)
	g.budget.grantWaiting(g.conf())
	if n := len(r.answers()); n != 1 {
		t.Errorf("%d answers, want 1", n)
	}
	// Bad wait_ms: refused at once, bad_request.
	r.send("bad", "", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: mib, WaitMS: codec.MaxLeaseWaitMS + 1})
	if a := r.next(t); a.e == nil || a.e.Code != codec.CodeBadRequest || a.e.Details["field"] != "wait_ms" {
		t.Errorf("wait_ms over the bound: %v", a.e)
	}
}

// Rule 4 and rule 5's stop: at most maxLeaseWaiters wait, accountBound of them of one
// account; the gateway stopping answers each unavailable, once, and every later waiter.
func TestLeaseWaitBounds(t *testing.T) {
	g := testGateway(t, admissionConfig)
	r := newWaitRecorder(g)
	hog(t, g, 800*mib, 600000)
	bound := accountBound(maxLeaseWaiters)
	for i := range bound {
		r.send(fmt.Sprint("a", i), "account:A", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 100 * mib, Class: "batch", WaitMS: 60000})
	}
	r.send("a-over", "account:A", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 100 * mib, Class: "batch", WaitMS: 60000})
	if a := r.next(t); a.name != "a-over" || a.e == nil || a.e.Code != codec.CodeOverloaded || a.e.Details["limit"] != bound {
		t.Fatalf("account A's waiter past its bound: %+v %v, want overloaded with limit %d", a, a.e, bound)
	}
	for i := bound; i < maxLeaseWaiters; i++ {
		r.wait(fmt.Sprint("own", i), "batch", 100*mib)
	}
	r.wait("over", "batch", 100*mib)
	if a := r.next(t); a.name != "over" || a.e == nil || a.e.Code != codec.CodeOverloaded || a.e.Details["limit"] != maxLeaseWaiters {
		t.Fatalf("a waiter past the bound: %+v %v, want overloaded with limit %d", a, a.e, maxLeaseWaiters)
	}
	if n := g.budget.waits.waiting(); n != maxLeaseWaiters {
		t.Fatalf("%d waiting, want %d", n, maxLeaseWaiters)
	}
	g.budget.waits.stop()
	seen := map[string]bool{}
	for range maxLeaseWaiters {
		a := r.next(t)
		if a.e == nil || a.e.Code != codec.CodeUnavailable || seen[a.name] {
			t.Fatalf("at the stop: %+v %v, want each waiter answered unavailable once", a, a.e)
		}
		seen[a.name] = true
	}
	r.wait("late", "batch", 100*mib)
	if a := r.next(t); a.name != "late" || a.e == nil || a.e.Code != codec.CodeUnavailable {
		t.Errorf("a waiter after the stop: %+v %v, want unavailable", a, a.e)
	}
	g.budget.grantWaiting(g.conf())
	if n := len(r.answers()); n != maxLeaseWaiters+3 {
		t.Errorf("%d answers, want one per request (%d)", n, maxLeaseWaiters+3)
	}
}

// Rule 3: the runner grants a waiter on each event that makes room, no client asking
// again: a release, a worker's heartbeat with less memory, a foreign reading that drops, a
// reload that raises the capacity, a lease's expiry.
func TestLeaseWaitWoken(t *testing.T) {
	start := func(t *testing.T, g *Gateway) *waitRecorder {
		t.Cleanup(g.budget.startWaits(g.conf))
		return newWaitRecorder(g)
	}
	granted := func(t *testing.T, r *waitRecorder) {
		t.Helper()
		if a := r.next(t); a.e != nil || a.l.Lease == "" {
			t.Fatalf("%s: %v, want granted", a.name, a.e)
		}
	}
	t.Run("release", func(t *testing.T) {
		g := testGateway(t, admissionConfig)
		r := start(t, g)
		h := hog(t, g, 800*mib, 600000)
		r.wait("w", "urgent", 100*mib)
		release(t, g, h)
		granted(t, r)
	})
	t.Run("heartbeat", func(t *testing.T) {
		g := testGateway(t, admissionConfig)
		r := start(t, g)
		f := newWakingFleet(t, g)
		f.beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(800)})
		r.wait("w", "urgent", 100*mib)
		f.beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(100)})
		granted(t, r)
	})
	t.Run("foreign", func(t *testing.T) {
		g, _, fake, _ := foreignGateway(t)
		r := start(t, g)
		fake.set(map[int]int64{777: 800 * mib}, nil)
		g.budget.foreign.poll(g.conf())
		r.wait("w", "urgent", 100*mib)
		fake.set(map[int]int64{777: 10 * mib}, nil)
		g.budget.foreign.poll(g.conf())
		granted(t, r)
	})
	t.Run("reload", func(t *testing.T) {
		g := testGateway(t, admissionConfig)
		r := start(t, g)
		hog(t, g, 800*mib, 600000)
		r.wait("w", "urgent", 500*mib)
		g.reloader.cfg.Store(parseConfig(t, reloadedConfig(""))) // cuda:0: a 2 GiB budget
		g.reloader.kick()
		granted(t, r)
	})
	t.Run("expiry", func(t *testing.T) {
		g := testGateway(t, admissionConfig)
		r := start(t, g)
		hog(t, g, 800*mib, 200)
		r.wait("w", "urgent", 100*mib)
		granted(t, r)
	})
}

// newWakingFleet is newFleet whose tracker tells the gateway's own listener too (the
// waiting leases woken at each change), as the gateway wires it.
func newWakingFleet(t *testing.T, g *Gateway) *fleet {
	t.Helper()
	f := &fleet{t: t, g: g, changed: make(chan struct{}, 1)}
	g.tracker.MissCount, g.tracker.Listener = 3, wakingListener{trackerListener{g}, fleetListener{f.changed}}
	if err := g.tracker.Start(g.nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.tracker.Stop)
	return f
}

// wakingListener is the gateway's tracker listener, whose changes the fleet follows too.
type wakingListener struct {
	trackerListener
	f fleetListener
}

func (l wakingListener) Changed() { l.trackerListener.Changed(); l.f.Changed() }
