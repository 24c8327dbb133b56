package gateway

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/devices"
	"github.com/ortbus/ortbus/subjects"
)

// gateSpy receives the gate states of device published by g.
func gateSpy(t *testing.T, g *Gateway, device string) func() codec.Gate {
	t.Helper()
	subj, err := subjects.Gate(g.id, device)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *nats.Msg, 64)
	sub, err := g.nc.ChanSubscribe(subj, ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	g.nc.Flush()
	return func() codec.Gate {
		t.Helper()
		select {
		case m := <-ch:
			var gs codec.Gate
			if err := codec.Unmarshal(m.Data, &gs); err != nil {
				t.Fatal(err)
			}
			if err := gs.Validate(); err != nil {
				t.Fatalf("a gate state the gateway published does not validate: %v", err)
			}
			return gs
		case <-time.After(10 * time.Second):
			t.Fatal("no gate state published")
		}
		return codec.Gate{}
	}
}

// TestGateDecision: rules 1, 2 and 4 of gate.go on the admissionConfig's cuda:0: no gate
// without a gated lease; with one, the gate is published at once, open, then closed as
// soon as urgent work runs on the device (not interactive: the gating class is urgent by
// default), with a growing seq and the gate's ttl; status shows it closed and its share
// of the minute; a gate_class of interactive closes it for interactive work too.
func TestGateDecision(t *testing.T) {
	for _, gating := range []string{"", "interactive"} {
		t.Run("gate_class="+gating, func(t *testing.T) {
			toml := admissionConfig
			if gating != "" {
				toml = strings.Replace(toml, "[devices.\"cuda:0\"]\ncapacity = \"1GiB\"\n", "[devices.\"cuda:0\"]\ncapacity = \"1GiB\"\ngate_class = \""+gating+"\"\n", 1)
			}
			g := testGateway(t, toml)
			next := gateSpy(t, g, "cuda:0")
			now := time.Now()
			g.gates.decide(now, g.conf())
			if st := g.gates.list(now); len(st) != 0 {
				t.Fatalf("gates without a gated lease: %+v", st)
			}
			l, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: mib, Class: "batch", Gate: true})
			if e != nil || l.Gateway != g.id || !l.Gate {
				t.Fatalf("gated lease: %+v %v", l, e)
			}
			g.gates.decide(now, g.conf())
			first := next()
			if first.Closed || first.Gateway != g.id || first.Device != "cuda:0" || first.TTLMS != gateTTL.Milliseconds() {
				t.Fatalf("first state %+v, want open with the gate's ttl", first)
			}
			// A request of class running on cuda:0 (n 1), or gone (n -1); not measured,
			// so long enough for a pause (rule 1).
			load := func(class string, n int) {
				g.d.inspect(func(lc *lifecycle) {
					id := "running-" + class
					if n > 0 {
						lc.byID[id] = &flight{p: &pending{id: id, op: "tag", class: class}, state: stClaimed, pool: "a", device: "cuda:0"}
					} else {
						delete(lc.byID, id)
					}
					lc.load.add("cuda:0", class, n)
				})
			}
			// Interactive work closes it only with gate_class = interactive.
			load("interactive", 1)
			now = now.Add(gateTick)
			g.gates.decide(now, g.conf())
			if gating == "interactive" {
				if s := next(); !s.Closed || s.Seq <= first.Seq || s.Class != "interactive" {
					t.Fatalf("interactive work with gate_class interactive: %+v", s)
				}
			} else if st := g.gates.list(now); st[0].Paused {
				t.Fatalf("interactive work closed the urgent gate: %+v", st)
			}
			load("interactive", -1)
			// Urgent work closes it in either case, published at once.
			load("urgent", 1)
			now = now.Add(gateRefresh)
			g.gates.decide(now, g.conf())
			closed := next()
			if !closed.Closed || closed.Seq <= first.Seq {
				t.Errorf("urgent work: %+v (first seq %d)", closed, first.Seq)
			}
			now = now.Add(30 * time.Second)
			st := g.gates.list(now)
			if len(st) != 1 || !st[0].Paused || st[0].PausedShare1m < 0.45 || st[0].Tenants != 1 || st[0].PausedTotalMS < 30_000 {
				t.Errorf("status of the gate closed for 30 s: %+v", st)
			}
			// Unchanged, it is published again every gateRefresh; the work done, open at once.
			g.gates.decide(now.Add(gateRefresh), g.conf())
			if s := next(); !s.Closed || s.Seq <= closed.Seq {
				t.Errorf("refresh: %+v", s)
			}
			load("urgent", -1)
			g.gates.decide(now.Add(gateRefresh+gateTick), g.conf())
			if s := next(); s.Closed {
				t.Errorf("open after the work: %+v", s)
			}
			// Open, its total pause time keeps what it was closed, past the minute too.
			if st := g.gates.list(now.Add(2 * time.Minute)); len(st) != 1 || st[0].Paused || st[0].PausedShare1m != 0 ||
				st[0].PausedTotalMS < 30_000 || st[0].PausedTotalMS > 31_000 {
				t.Errorf("status of the gate open again: %+v", st)
			}
			// The lease gone, so is the gate.
			leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRelease, Lease: l.Lease})
			g.gates.decide(now.Add(time.Second), g.conf())
			if st := g.gates.list(now); len(st) != 0 {
				t.Errorf("gates after the release: %+v", st)
			}
		})
	}
}

// TestLeaseReclaim: rule 6 of lease.go. An interactive acquire refused for memory
// presses the reclaimable batch lease (not the plain one, nor a higher class's): its
// tag is in the gate, the renew reply says pressed; a reading that measures its holder's
// processes (the pid and its descendants, on this host) below its bytes shrinks it, and
// the acquire fits. A holder on another host is never measured; a press ends on its own.
func TestLeaseReclaim(t *testing.T) {
	g := testGateway(t, admissionConfig)
	now := time.Now()
	leaseNow = func() time.Time { return now }
	t.Cleanup(func() { leaseNow = time.Now })
	acquire := func(class string, bytes int64, reclaim bool) (*codec.LeaseReply, *codec.Error) {
		return leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: bytes, Class: class, Reclaim: reclaim, TTLMS: 600000})
	}
	batch, e := acquire("batch", 500*mib, true)
	if e != nil {
		t.Fatal(e)
	}
	plain, e := acquire("batch", 100*mib, false)
	if e != nil {
		t.Fatal(e)
	}
	if _, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: batch.Lease, TTLMS: 600000, PID: 1234, Host: "here"}); e != nil {
		t.Fatal(e)
	}
	if got := g.budget.leases.gated(now); len(got) != 0 {
		t.Fatalf("gates before any press: %+v", got)
	}
	// A batch asker presses nothing (the lease's class is not below it).
	if _, e := acquire("batch", 500*mib, false); e == nil || g.budget.leases.pressedOn("cuda:0", now) {
		t.Fatalf("a batch acquire over the budget: %v, pressed %v", e, g.budget.leases.pressedOn("cuda:0", now))
	}
	// An account presses only its own leases: another app's interactive (or urgent) acquire
	// over the budget does not run this lease's hook.
	if _, e := leaseAs(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 500 * mib, Class: "interactive", TTLMS: 600000}, "app-b"); e == nil || g.budget.leases.pressedOn("cuda:0", now) {
		t.Fatalf("another account's acquire over the budget: %v, pressed %v", e, g.budget.leases.pressedOn("cuda:0", now))
	}
	if _, e := acquire("interactive", 500*mib, false); e == nil || e.Code != codec.CodeOverloaded {
		t.Fatalf("interactive acquire over the budget: %v", e)
	}
	h := g.budget.leases.gated(now)["cuda:0"]
	if len(h.tags) != 1 || h.tags[0] != codec.LeaseTag(batch.Lease) || h.gated != 0 {
		t.Fatalf("the gate of cuda:0 after the press: %+v, want the reclaimable lease's tag", h)
	}
	if r, _ := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: batch.Lease, TTLMS: 600000}); !r.Pressed {
		t.Error("the renew reply does not say pressed")
	}
	if r, _ := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: plain.Lease, TTLMS: 600000}); r.Pressed {
		t.Error("the lease without a hook is pressed")
	}
	tree := func(pid int) []int { return []int{pid, pid + 1} }
	usage := map[int]int64{1234: 100 * mib, 1235: 20 * mib, 99: 400 * mib}
	// Another host's reading: nothing shrinks.
	if got := g.budget.leases.shrinkPressed("cuda:0", "elsewhere", usage, tree); len(got) != 0 {
		t.Fatalf("shrunk from another host's reading: %+v", got)
	}
	got := g.budget.leases.shrinkPressed("cuda:0", "here", usage, tree)
	if len(got) != 1 || got[0].Bytes != 120*mib || got[0].Pressed {
		t.Fatalf("shrink: %+v, want the lease at the 120 MiB its processes use", got)
	}
	if g.budget.leases.pressedOn("cuda:0", now) {
		t.Error("still pressed after the shrink")
	}
	if _, e := acquire("interactive", 500*mib, false); e != nil {
		t.Errorf("the interactive acquire after the shrink: %v", e)
	}
	// Shrunk, it is measured on for pressSettle and not pressed again meanwhile (its hook
	// ran once); then a pool's reclaim presses it again; worth a wait only where the
	// holder's usage is measured: a reader for the device, and the holder on this host.
	if g.budget.reclaim(g.conf(), "cuda:0", 0); g.budget.leases.pressedOn("cuda:0", now) {
		t.Fatal("pressed again while it settles")
	}
	now = now.Add(pressSettle)
	if g.budget.reclaim(g.conf(), "cuda:0", 0) || !g.budget.leases.pressedOn("cuda:0", now) {
		t.Fatal("reclaim for an urgent pool: no press, or a wait without a reader")
	}
	g.budget.foreign.readers = map[string]devices.ProcessReader{"cuda:0": idleReader{}}
	if g.budget.presser.pressing("cuda:0") {
		t.Fatal("a wait for a holder on another host")
	}
	host, _ := os.Hostname()
	leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: batch.Lease, TTLMS: 600000, PID: 1234, Host: host})
	if !g.budget.presser.pressing("cuda:0") {
		t.Fatal("no wait for a measurable holder")
	}
	// A press ends on its own.
	now = now.Add(pressFor)
	if g.budget.presser.pressing("cuda:0") || len(g.budget.leases.gated(now)) != 0 {
		t.Error("a press outlives pressFor")
	}
}

// TestGateDemand: rule 1 on the lifecycle alone (fakeEnv: pools gpu and cpu on devices
// dev-gpu and dev-cpu): a queued urgent request closes the gates of every device among its
// candidates; running, only its own device's; interactive work closes only a gate whose
// class is interactive; batch none. Work not measured yet counts as long enough for a
// pause (TestGateDemandShortWork: measured work shorter than a pause can cover).
func TestGateDemand(t *testing.T) {
	lc := newTestLifecycle()
	prio := func(c string) (int, bool) {
		p, ok := map[string]int{"urgent": 0, "interactive": 1, "batch": 2}[c]
		return p, ok
	}
	classes := map[string]string{"dev-gpu": "urgent", "dev-cpu": "interactive", "dev-x": "urgent"}
	unmeasured := func(string, *pending) time.Duration { return 0 }
	demand := func() map[string]bool {
		return lc.gateDemand(classes, []string{"urgent", "interactive"}, prio, unmeasured)
	}
	if d := demand(); len(d) != 0 {
		t.Fatalf("demand with nothing queued: %v", d)
	}
	lc.accept(req("b", "batch"), []string{"gpu"}, t0)
	if d := demand(); len(d) != 0 {
		t.Fatalf("demand with batch queued: %v", d)
	}
	lc.accept(req("i", "interactive"), []string{"gpu"}, t0)
	if d := demand(); !d["dev-cpu"] || d["dev-gpu"] || d["dev-x"] {
		t.Fatalf("interactive queued (candidates gpu, cpu): %v, want only the interactive gate", d)
	}
	lc.accept(req("u", "urgent"), []string{"gpu"}, t0)
	if d := demand(); !d["dev-gpu"] || !d["dev-cpu"] || d["dev-x"] {
		t.Fatalf("urgent queued: %v, want both its candidates' devices", d)
	}
	// Dispatched to gpu, every one: running, each closes its own device's gate only.
	lc.pass(t0, to("gpu", ""))
	if d := demand(); !d["dev-gpu"] || d["dev-cpu"] {
		t.Fatalf("urgent and interactive running on dev-gpu: %v", d)
	}
}

// TestGateDemandShortWork: rule 1's cover. Urgent requests measured at 3 ms each (a VAD
// frame) leave the gate open, one or a few at once, running or queued, since a pause
// would land after them; enough of them to add up to gateCover close it, and so does one
// request measured at 100 ms (a camera frame).
func TestGateDemandShortWork(t *testing.T) {
	lc := newTestLifecycle()
	prio := func(c string) (int, bool) {
		p, ok := map[string]int{"urgent": 0, "interactive": 1, "batch": 2}[c]
		return p, ok
	}
	classes := map[string]string{"dev-gpu": "interactive"}
	est := func(_ string, p *pending) time.Duration {
		if p.class == "urgent" {
			return 3 * time.Millisecond
		}
		return 100 * time.Millisecond
	}
	demand := func() map[string]bool { return lc.gateDemand(classes, []string{"urgent", "interactive"}, prio, est) }
	lc.accept(req("u0", "urgent"), []string{"gpu"}, t0)
	if d := demand(); d["dev-gpu"] {
		t.Fatalf("one 3 ms frame queued closes the gate: %v", d)
	}
	lc.pass(t0, to("gpu", ""))
	lc.accept(req("u1", "urgent"), []string{"gpu"}, t0)
	if d := demand(); d["dev-gpu"] {
		t.Fatalf("two 3 ms frames, one running, one queued, close the gate: %v", d)
	}
	n := int(gateCover / (3 * time.Millisecond))
	for i := 2; i <= n; i++ {
		lc.accept(req(fmt.Sprintf("u%d", i), "urgent"), []string{"gpu"}, t0)
	}
	if d := demand(); !d["dev-gpu"] {
		t.Fatalf("a backlog of %d frames of 3 ms (%v >= gateCover) leaves the gate open", n+1, time.Duration(n+1)*3*time.Millisecond)
	}
	lc2 := newTestLifecycle()
	lc2.accept(req("i", "interactive"), []string{"gpu"}, t0)
	if d := lc2.gateDemand(classes, []string{"urgent", "interactive"}, prio, est); !d["dev-gpu"] {
		t.Fatalf("a 100 ms camera frame queued leaves the gate open: %v", d)
	}
	lc2.pass(t0, to("gpu", ""))
	if d := lc2.gateDemand(classes, []string{"urgent", "interactive"}, prio, est); !d["dev-gpu"] {
		t.Fatalf("a 100 ms camera frame running leaves the gate open: %v", d)
	}
}

// idleReader is a devices.ProcessReader that reads no process.
type idleReader struct{}

func (idleReader) ProcessMemory(string) (map[int]int64, error) { return nil, nil }
