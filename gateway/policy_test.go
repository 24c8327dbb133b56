package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/sched"
)

// The device sharing policy and deadline feasibility (policy.go), in process.

// policyConfig: pools gpurt (urgent, interactive) and gpubatch (batch, dynamic batches of
// 4) share cuda:0; cpurt (interactive) is on the CPU. minShare < 0 leaves batch's
// min_share at its default (0.1).
func policyConfig(policy string, minShare float64, degrade bool) string {
	share := ""
	if minShare >= 0 {
		share = fmt.Sprintf("min_share = %v", minShare)
	}
	return fmt.Sprintf(`
[nats]
url = "nats://127.0.0.1:1"
[gateway]
policy = %q
[security]
allowed_roots = ["/srv"]
[devices."cuda:0"]
capacity = "8GiB"
[classes.interactive]
chain = ["gpurt", "cpurt"]
degrade = %v
[classes.batch]
chain = ["gpubatch"]
%s
[classes.bulk2]
priority = 3
chain = ["gpubatch"]
[pools.gpurt]
local = false
device = "cuda:0"
classes = ["urgent", "interactive"]
models = ["tagger"]
slots = 2
[pools.gpubatch]
local = false
device = "cuda:0"
classes = ["batch", "bulk2"]
models = ["tagger"]
slots = 2
max_batch = 4
[pools.cpurt]
local = false
classes = ["interactive"]
models = ["tagger"]
[models.tagger]
kind = "tagger-pixai"
dir = "/srv/m/tagger"
`, policy, degrade, share)
}

// setLoad sets the requests in flight on a device for a class in a snapshot.
func setLoad(c *capacity, device, class string, n int) {
	c.load.add(device, class, n-c.load[device][class])
}

// TestShareBatchOneUnit: while a higher class has requests in flight on the device, or
// reserves a pool on it, batch is held to one unit there (max_batch items); at full rate
// otherwise. Higher classes are never held; other devices do not count.
func TestShareBatchOneUnit(t *testing.T) {
	c := snapOf(t, policyConfig("priority", 0, false))
	ready(c, "gpubatch", 2, "batch", "bulk2")

	setLoad(c, "cuda:0", "batch", 100)
	if !c.shareAllows("gpubatch", "batch", nil) {
		t.Fatal("batch held with no higher class on the device")
	}
	setLoad(c, "cuda:0", "bulk2", 5) // a lower class (priority 3) does not hold batch
	if !c.shareAllows("gpubatch", "batch", nil) {
		t.Fatal("batch held by a lower class in flight")
	}
	setLoad(c, "cuda:0", "bulk2", 0)
	setLoad(c, "cpu", "interactive", 5)
	if !c.shareAllows("gpubatch", "batch", nil) {
		t.Fatal("batch held by interactive work on another device")
	}
	if !c.shareAllows("gpubatch", "batch", map[string]bool{"cpurt": true}) {
		t.Fatal("batch held by a reserved pool on another device")
	}

	for _, hold := range []struct {
		name     string
		class    string // a higher class in flight on cuda:0, or
		reserved map[string]bool
	}{
		{"interactive in flight", "interactive", nil},
		{"urgent in flight", "urgent", nil},
		{"a waiting item reserves gpurt", "", map[string]bool{"gpurt": true}},
	} {
		if hold.class != "" {
			setLoad(c, "cuda:0", hold.class, 1)
		}
		setLoad(c, "cuda:0", "batch", 3)
		if !c.shareAllows("gpubatch", "batch", hold.reserved) {
			t.Errorf("%s: batch held below one unit (3 of 4 in flight)", hold.name)
		}
		setLoad(c, "cuda:0", "batch", 4)
		if c.shareAllows("gpubatch", "batch", hold.reserved) {
			t.Errorf("%s: batch allowed past one unit (4 of 4 in flight)", hold.name)
		}
		// Higher classes are never held by the rule.
		for _, cl := range []string{"urgent", "interactive"} {
			if !c.shareAllows("gpurt", cl, hold.reserved) {
				t.Errorf("%s: %s held", hold.name, cl)
			}
		}
		if hold.class != "" {
			setLoad(c, "cuda:0", hold.class, 0)
		}
	}
	// A background class below batch is held by batch in flight.
	setLoad(c, "cuda:0", "batch", 1)
	setLoad(c, "cuda:0", "bulk2", 4)
	if c.shareAllows("gpubatch", "bulk2", nil) {
		t.Error("priority-3 class not held by batch (priority 2) in flight")
	}
}

// TestShareGateClosed: while the device's compute gate is closed, batch starts no unit
// there beyond min_share's whole slots (none with the default 0.1 of 4 slots, one with 0.5);
// with the gate open, its one unit again; another device's gate does not count.
func TestShareGateClosed(t *testing.T) {
	for _, tc := range []struct {
		minShare float64
		units    int
	}{{-1, 0}, {0.5, 2}} {
		t.Run(fmt.Sprint("min_share=", tc.minShare), func(t *testing.T) {
			c := snapOf(t, policyConfig("priority", tc.minShare, false))
			ready(c, "gpurt", 2, "urgent", "interactive")
			ready(c, "gpubatch", 2, "batch", "bulk2")
			setLoad(c, "cuda:0", "interactive", 1)
			c.gated = map[string]bool{"cpu": true}
			setLoad(c, "cuda:0", "batch", 3)
			if !c.shareAllows("gpubatch", "batch", nil) {
				t.Fatal("another device's closed gate holds batch below its one unit")
			}
			c.gated = map[string]bool{"cuda:0": true}
			limit := tc.units * 4
			if tc.units > 0 {
				setLoad(c, "cuda:0", "batch", limit-1)
				if !c.shareAllows("gpubatch", "batch", nil) {
					t.Errorf("gate closed: batch held at %d in flight, min_share's allowance %d", limit-1, limit)
				}
			}
			setLoad(c, "cuda:0", "batch", limit)
			if c.shareAllows("gpubatch", "batch", nil) {
				t.Errorf("gate closed: batch allowed at %d in flight, min_share's allowance %d", limit, limit)
			}
			if !c.shareAllows("gpurt", "interactive", nil) {
				t.Error("gate closed: interactive held")
			}
			c.gated = nil
			setLoad(c, "cuda:0", "batch", 0)
			if !c.shareAllows("gpubatch", "batch", nil) {
				t.Error("gate open: batch held below its one unit")
			}
		})
	}
}

// TestShareOffUnderFIFO: policy fifo has no sharing rule.
func TestShareOffUnderFIFO(t *testing.T) {
	c := snapOf(t, policyConfig("fifo", 0, false))
	setLoad(c, "cuda:0", "urgent", 3)
	setLoad(c, "cuda:0", "batch", 50)
	if !c.shareAllows("gpubatch", "batch", map[string]bool{"gpurt": true}) {
		t.Fatal("batch held under policy fifo")
	}
}

// TestShareMinShare: min_share raises batch's allowance to max(1, ⌊min_share × live
// slots on the device⌋) units, so batch is not starved.
func TestShareMinShare(t *testing.T) {
	cases := []struct {
		minShare float64
		units    int
	}{
		{0, 1},
		{-1, 1},  // default 0.1 × 6 slots = 0.6: still one unit
		{0.5, 3}, // 0.5 × 6 = 3 units
		{0.9, 5}, // ⌊5.4⌋
	}
	for _, tc := range cases {
		name := fmt.Sprint("min_share=", tc.minShare)
		if tc.minShare < 0 {
			name = "min_share=default"
		}
		t.Run(name, func(t *testing.T) {
			c := snapOf(t, policyConfig("priority", tc.minShare, false))
			ready(c, "gpurt", 2, "urgent", "interactive")
			ready(c, "gpurt", 2, "urgent", "interactive")
			ready(c, "gpubatch", 2, "batch", "bulk2")
			ready(c, "cpurt", 8, "interactive") // another device: not counted
			if slots := c.deviceSlots["cuda:0"]; slots != 6 {
				t.Fatalf("live slots on cuda:0 = %d, want 6", slots)
			}
			setLoad(c, "cuda:0", "interactive", 1)
			limit := tc.units * 4
			setLoad(c, "cuda:0", "batch", limit-1)
			if !c.shareAllows("gpubatch", "batch", nil) {
				t.Errorf("batch held at %d in flight, allowance %d", limit-1, limit)
			}
			setLoad(c, "cuda:0", "batch", limit)
			if c.shareAllows("gpubatch", "batch", nil) {
				t.Errorf("batch allowed at %d in flight, allowance %d", limit, limit)
			}
		})
	}
}

// TestShareThroughRoute: with interactive work in flight on cuda:0, batch items are
// routed there one unit at a time although the pool has room for more; once the
// interactive work is done batch resumes up to the pool's room.
func TestShareThroughRoute(t *testing.T) {
	c := snapOf(t, policyConfig("priority", 0, false))
	ready(c, "gpurt", 2, "urgent", "interactive")
	ready(c, "gpubatch", 2, "batch", "bulk2") // room 2 × 4 = 8
	if pool := routeOK(t, c, newItem("interactive", "tag", soon(), "gpurt", "cpurt"), nil); pool != "gpurt" {
		t.Fatalf("interactive routed to %q", pool)
	}
	routed := func() int {
		n := 0
		for range 10 {
			if pool := routeOK(t, c, newItem("batch", "tag", soon(), "gpubatch"), nil); pool == "gpubatch" {
				n++
			}
		}
		return n
	}
	if n := routed(); n != 4 {
		t.Fatalf("%d batch items routed while interactive runs on the device, want one unit of 4", n)
	}
	setLoad(c, "cuda:0", "interactive", 0) // its answer came back
	c = nextPass(c)
	if n := routed(); n != 4 {
		t.Fatalf("%d more batch items routed once the device is free of interactive work, want the remaining room 4", n)
	}
}

// TestShareReservedInDispatch: an urgent item waiting for a full pool on the device
// reserves it for the pass, which holds the batch items behind it to one unit on that
// device; the urgent item stays queued.
func TestShareReservedInDispatch(t *testing.T) {
	c := snapOf(t, policyConfig("priority", 0, false))
	ready(c, "gpurt", 1, "urgent", "interactive")
	ready(c, "gpubatch", 2, "batch", "bulk2")
	c.pools["gpurt"].busy = 1 // full, with nothing counted on the device's load
	q := newQueues(c.cfg)
	for range 6 {
		if _, err := q.Push(newItem("batch", "tag", soon(), "gpubatch")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Push(newItem("urgent", "tag", soon(), "gpurt")); err != nil {
		t.Fatal(err)
	}
	out, failed := q.Dispatch(c.now, func(it *sched.Item, r map[string]bool) (string, error) { return routeIn(c, it, r) })
	if len(failed) != 0 {
		t.Fatalf("failed %v", failed[0].Err)
	}
	for _, a := range out {
		if a.Item.Class != "batch" || a.Pool != "gpubatch" {
			t.Fatalf("dispatched %s to %s", a.Item.Class, a.Pool)
		}
	}
	if len(out) != 4 || q.Len("urgent") != 1 || q.Len("batch") != 2 {
		t.Fatalf("dispatched %d batch items with urgent waiting on the device, want 4; left urgent %d batch %d",
			len(out), q.Len("urgent"), q.Len("batch"))
	}
}

// TestEstimator: the measured service time is a moving average, 7/8 old and 1/8 new,
// per pool, op and model; unmeasured is zero; all is a copy.
func TestEstimator(t *testing.T) {
	var e estimator
	k := estKey{"gpurt", "tag", "tagger"}
	if e.get(k) != 0 || len(e.all()) != 0 {
		t.Fatal("unmeasured estimate not zero")
	}
	for _, s := range []struct{ observe, want time.Duration }{
		{800 * time.Millisecond, 800 * time.Millisecond}, // the first measurement is taken as is
		{0, 700 * time.Millisecond},
		{1500 * time.Millisecond, 800 * time.Millisecond},
	} {
		e.observe(k, s.observe)
		if got := e.get(k); got != s.want {
			t.Fatalf("after observing %s: %s, want %s", s.observe, got, s.want)
		}
	}
	for _, other := range []estKey{{"cpurt", "tag", "tagger"}, {"gpurt", "embed", "tagger"}, {"gpurt", "tag", "other"}} {
		if e.get(other) != 0 {
			t.Fatalf("%v shares the estimate of %v", other, k)
		}
	}
	all := e.all()
	all[k] = time.Hour
	if len(all) != 1 || e.get(k) != 800*time.Millisecond {
		t.Fatalf("all %v is not a copy of the one measurement", all)
	}
}

// TestFeasibleFromReplies: a worker's reply (its total_us − queue_us) is what the next
// request of that pool, op and model is expected to take: a pool is infeasible when now
// + that time is past the deadline, and the route passes it over for the next pool.
func TestFeasibleFromReplies(t *testing.T) {
	g := testGateway(t, policyConfig("priority", 0, false))
	body, err := codec.Marshal(&codec.TagReply{Served: codec.Served{Model: "tagger", Timing: codec.Timing{QueueUS: 100_000, InferUS: 150_000, TotalUS: 300_000}}})
	if err != nil {
		t.Fatal(err)
	}
	served := &pending{id: "done", op: "tag", class: "interactive", req: codec.Request{ID: "done", Model: "tagger"}, reply: func([]byte, *codec.Error) {}}
	g.d.relay(served, "gpurt", &nats.Msg{Data: body})
	if got := g.d.est.get(estKey{"gpurt", "tag", "tagger"}); got != 200*time.Millisecond {
		t.Fatalf("service time from the reply %s, want 200ms", got)
	}

	c := g.d.snapshot(time.Now(), g.d.lc.held())
	feasible := func(pool string, left time.Duration) bool {
		return c.feasible(estKey{pool, "tag", "tagger"}, "interactive", c.now.Add(left))
	}
	if feasible("gpurt", 150*time.Millisecond) {
		t.Error("feasible with 150ms left for a 200ms service time")
	}
	if !feasible("gpurt", 200*time.Millisecond) || !feasible("gpurt", time.Second) {
		t.Error("infeasible with 200ms or more left for a 200ms service time")
	}
	if !feasible("cpurt", time.Millisecond) {
		t.Error("a pool without a measurement is infeasible")
	}

	ready(c, "gpurt", 2, "urgent", "interactive")
	ready(c, "cpurt", 1, "interactive")
	it := newItem("interactive", "tag", c.now.Add(150*time.Millisecond), "gpurt", "cpurt")
	if pool := routeOK(t, c, it, nil); pool != "cpurt" {
		t.Fatalf("routed to %q, want cpurt past the too-slow gpurt", pool)
	}

	fifo := snapOf(t, policyConfig("fifo", 0, false))
	fifo.est[estKey{"gpurt", "tag", "tagger"}] = time.Hour
	if !fifo.feasible(estKey{"gpurt", "tag", "tagger"}, "interactive", fifo.now.Add(time.Millisecond)) {
		t.Error("policy fifo checked feasibility")
	}
}

// TestFeasibleDegrade: with degrade on, the estimate grows by the device's requests in
// flight per live slot, so a loaded preferred pool is passed over for the next one of the
// chain; without degrade the load does not count.
func TestFeasibleDegrade(t *testing.T) {
	for _, degrade := range []bool{false, true} {
		t.Run(fmt.Sprint("degrade=", degrade), func(t *testing.T) {
			c := snapOf(t, policyConfig("priority", 0, degrade))
			ready(c, "gpurt", 2, "urgent", "interactive")
			ready(c, "gpubatch", 2, "batch", "bulk2") // 4 live slots on cuda:0
			ready(c, "cpurt", 1, "interactive")
			k := estKey{"gpurt", "tag", "tagger"}
			c.est[k] = 100 * time.Millisecond
			setLoad(c, "cuda:0", "batch", 4) // 100ms × (1 + 4/4) = 200ms when degrading

			deadline := c.now.Add(150 * time.Millisecond)
			if ok := c.feasible(k, "interactive", deadline); ok == degrade {
				t.Fatalf("feasible %v with 150ms left, 100ms measured and the device loaded 4 of 4", ok)
			}
			want := "gpurt"
			if degrade {
				want = "cpurt"
			}
			if pool := routeOK(t, c, newItem("interactive", "tag", deadline, "gpurt", "cpurt"), nil); pool != want {
				t.Fatalf("routed to %q, want %s", pool, want)
			}

			setLoad(c, "cuda:0", "batch", 0)
			setLoad(c, "cuda:0", "interactive", 0)
			setLoad(c, "cpu", "interactive", 0)
			if !c.feasible(k, "interactive", deadline) {
				t.Fatal("infeasible on an idle device")
			}
		})
	}
}

// onePoolConfig: one pool, gpu, serves urgent, interactive and batch on cuda:0 (the shape
// of the one-pool collision bench); bulk (batch only, dynamic batches of 4) is on cuda:1.
// gateway and batch are more lines of [gateway] (a reserve_window) and [classes.batch].
func onePoolConfig(policy, gateway, batch string) string {
	return fmt.Sprintf(`
[nats]
url = "nats://127.0.0.1:1"
[gateway]
policy = %q
%s
[security]
allowed_roots = ["/srv"]
[devices."cuda:0"]
capacity = "8GiB"
[devices."cuda:1"]
capacity = "8GiB"
[classes.batch]
chain = ["gpu", "bulk"]
%s
[pools.gpu]
local = false
device = "cuda:0"
classes = ["urgent", "interactive", "batch"]
models = ["tagger"]
[pools.bulk]
local = false
device = "cuda:1"
classes = ["batch"]
models = ["tagger"]
max_batch = 4
[models.tagger]
kind = "tagger-pixai"
dir = "/srv/m/tagger"
`, policy, gateway, batch)
}

// inFlight sets the requests of class in flight in pool (on device) in a snapshot.
func inFlight(c *capacity, pool, device, class string, n int) {
	c.pools[pool].busy += n - c.load[device][class]
	setLoad(c, device, class, n)
}

// TestReserveLastSlot: while interactive or urgent work was active on the device within
// gateway.reserve_window (default 2s), batch beyond its floor may not take the device's
// last free slot; it may when more than one slot is free, once the window has passed, with
// the window 0, and under FIFO. Batch's own activity reserves nothing.
func TestReserveLastSlot(t *testing.T) {
	snap := func(policy, gateway string) *capacity {
		c := snapOf(t, onePoolConfig(policy, gateway, "min_share = 0"))
		for range 3 {
			ready(c, "gpu", 1, "urgent", "interactive", "batch") // 3 slots on cuda:0
		}
		return c
	}
	c := snap("priority", "")
	if c.cfg.Gateway.ReserveWindow.D() != 2*time.Second {
		t.Fatalf("default reserve_window %v, want 2s", c.cfg.Gateway.ReserveWindow)
	}
	allows := func(c *capacity, batchInFlight int) bool {
		inFlight(c, "gpu", "cuda:0", "batch", batchInFlight)
		return c.shareAllows("gpu", "batch", nil)
	}
	if !allows(c, 2) {
		t.Fatal("batch refused the last free slot with no latency work ever on the device")
	}
	c.active.see("cuda:0", "batch", c.now)
	if !allows(c, 2) {
		t.Fatal("batch's own activity reserved the last free slot")
	}
	for _, class := range []string{"interactive", "urgent"} {
		c := snap("priority", "")
		c.active.see("cuda:0", class, c.now.Add(-time.Second))
		if !allows(c, 1) {
			t.Errorf("%s active 1s ago: batch refused with 2 slots free", class)
		}
		if allows(c, 2) {
			t.Errorf("%s active 1s ago: batch took the last free slot", class)
		}
		if allows(c, 3) {
			t.Errorf("%s active 1s ago: batch allowed with no slot free", class)
		}
		inFlight(c, "gpu", "cuda:0", "batch", 2)
		for _, ago := range []time.Duration{2 * time.Second, 3 * time.Second} {
			c.now = c.active["cuda:0"][class].Add(ago)
			if !c.shareAllows("gpu", "batch", nil) {
				t.Errorf("%s active %v ago (window 2s): batch refused the last free slot", class, ago)
			}
		}
	}
	// Another device's latency work reserves nothing here.
	c = snap("priority", "")
	c.active.see("cuda:1", "interactive", c.now)
	if !allows(c, 2) {
		t.Error("interactive active on cuda:1 reserved cuda:0's last free slot")
	}

	for _, off := range []struct{ policy, gateway string }{
		{"priority", `reserve_window = "0s"`},
		{"fifo", ""},
	} {
		c := snap(off.policy, off.gateway)
		c.active.see("cuda:0", "interactive", c.now)
		if !allows(c, 2) {
			t.Errorf("policy %s %s: batch refused the last free slot", off.policy, off.gateway)
		}
	}
	c = snap("priority", `reserve_window = "500ms"`)
	c.active.see("cuda:0", "interactive", c.now.Add(-time.Second))
	if !allows(c, 2) {
		t.Error("reserve_window 500ms: interactive active 1s ago still reserves the slot")
	}
}

// TestReserveKeepsFloor: the reservation never holds batch below its floor (one unit, or
// min_share of the device's slots): on a device of a single slot batch still takes it;
// and the one-unit rule still holds batch at its floor while latency work is in flight,
// however many slots are free.
func TestReserveKeepsFloor(t *testing.T) {
	c := snapOf(t, onePoolConfig("priority", "", "min_share = 0"))
	ready(c, "gpu", 1, "urgent", "interactive", "batch")
	c.active.see("cuda:0", "interactive", c.now)
	if pool := routeOK(t, c, newItem("batch", "tag", soon(), "gpu"), nil); pool != "gpu" {
		t.Fatalf("one-slot device, interactive just active: batch routed to %q, want its one unit on gpu", pool)
	}

	c = snapOf(t, onePoolConfig("priority", "", "min_share = 0"))
	ready(c, "gpu", 4, "urgent", "interactive", "batch")
	inFlight(c, "gpu", "cuda:0", "interactive", 1)
	inFlight(c, "gpu", "cuda:0", "batch", 1) // 2 of 4 slots free
	if c.shareAllows("gpu", "batch", nil) {
		t.Error("interactive in flight: batch allowed past its one unit (one-unit rule)")
	}

	c = snapOf(t, onePoolConfig("priority", "", "min_share = 0.5")) // floor: 0.5 × 4 slots = 2 units
	ready(c, "gpu", 4, "urgent", "interactive", "batch")
	c.active.see("cuda:0", "interactive", c.now)
	inFlight(c, "gpu", "cuda:0", "interactive", 2)
	inFlight(c, "gpu", "cuda:0", "batch", 1) // the last slot free
	if !c.shareAllows("gpu", "batch", nil) {
		t.Error("min_share 0.5 of 4 slots: batch held below its floor of 2")
	}
	inFlight(c, "gpu", "cuda:0", "batch", 2)
	if c.shareAllows("gpu", "batch", nil) {
		t.Error("min_share 0.5 of 4 slots: batch allowed past its floor of 2 with interactive in flight")
	}
}

// TestReserveThroughRoute: on the one-pool shape with two slots, interactive active a
// second ago: batch gets one slot and the other stays free for the next urgent request;
// once the window has passed batch takes the free slot. In a batching pool, batch requests
// that join a started dynamic batch take no new slot: only a new batch is held back.
func TestReserveThroughRoute(t *testing.T) {
	c := snapOf(t, onePoolConfig("priority", "", "min_share = 0"))
	ready(c, "gpu", 1, "urgent", "interactive", "batch")
	ready(c, "gpu", 1, "urgent", "interactive", "batch")
	c.active.see("cuda:0", "interactive", c.now.Add(-time.Second))
	batch := func(pool string) int {
		n := 0
		for range 20 {
			if routeOK(t, c, newItem("batch", "tag", soon(), pool), nil) != "" {
				n++
			}
		}
		return n
	}
	if n := batch("gpu"); n != 1 {
		t.Fatalf("%d batch items routed to gpu (2 slots) with interactive active 1s ago, want 1", n)
	}
	if pool := routeOK(t, c, newItem("urgent", "tag", soon(), "gpu"), nil); pool != "gpu" {
		t.Fatalf("urgent routed to %q, want the reserved slot of gpu", pool)
	}
	inFlight(c, "gpu", "cuda:0", "urgent", 0) // answered
	c = nextPass(c)
	c.now = c.now.Add(2 * time.Second) // a pass 2s later, no latency work on cuda:0 since interactive's
	if n := batch("gpu"); n != 1 {
		t.Fatalf("%d batch items routed to gpu once the window passed, want the free slot", n)
	}

	// bulk on cuda:1: 3 slots of dynamic batches of 4; interactive was active there.
	ready(c, "bulk", 3, "batch")
	c.active.see("cuda:1", "interactive", c.now.Add(-time.Second))
	if n := batch("bulk"); n != 8 {
		t.Fatalf("%d batch items routed to bulk (3 slots × 4) with interactive active 1s ago, want 8: two batches, the third slot kept", n)
	}
	c = nextPass(c)
	c.now = c.now.Add(2 * time.Second)
	if n := batch("bulk"); n != 4 {
		t.Fatalf("%d more batch items routed to bulk once the window passed, want the third batch of 4", n)
	}
}
