package gateway

import (
	"time"

	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/sched"
)

// Worker selection (pick.go), on in-memory snapshots.

// readyWorker adds a live worker id of pool to the snapshot, taking direct items or not.
func readyWorker(c *capacity, pool, id string, slots int, direct bool, classes ...string) {
	c.addLive(health.Worker{HB: codec.Heartbeat{Worker: id, Pool: pool, Slots: slots, Classes: classes, State: codec.StateReady, Direct: direct}})
}

// TestPickFreeWorker: an item goes to the worker with a free slot, never to the busy one
// (rules 1, 2); with both free, ties go to the one with less in flight, then the lower id
// (rule 3).
func TestPickFreeWorker(t *testing.T) {
	c := snapOf(t, onePoolConfig("priority", "", ""))
	all := []string{"urgent", "interactive", "batch"}
	readyWorker(c, "gpu", "w1", 1, true, all...)
	readyWorker(c, "gpu", "w2", 1, true, all...)
	if got := c.pickWorker("gpu", "batch", "", false); got != "w1" {
		t.Fatalf("both free: %q, want w1 (lower id)", got)
	}
	if got := c.pickWorker("gpu", "interactive", "", false); got != "w2" {
		t.Fatalf("w1 runs a batch item: interactive sent to %q, want w2", got)
	}
	if got := c.pickWorker("gpu", "urgent", "", false); got != "" {
		t.Fatalf("both busy: urgent sent to %q, want the queue group", got)
	}
	if c.workers["w1"].busy["batch"] != 1 || c.workers["w2"].busy["interactive"] != 1 {
		t.Fatalf("counted %v %v, want w1 one batch, w2 one interactive", c.workers["w1"].busy, c.workers["w2"].busy)
	}
	c.workers["w1"].busy = map[string]int{}
	if got := c.pickWorker("gpu", "urgent", "", false); got != "w1" {
		t.Fatalf("w1 free again: urgent sent to %q, want w1", got)
	}
	// Idle workers take turns: the one given a request least recently goes first.
	c.workers["w1"].busy, c.workers["w2"].busy = map[string]int{}, map[string]int{}
	for i, want := range []string{"w2", "w1", "w2"} {
		got := c.pickWorker("gpu", "interactive", "", false)
		c.workers[got].busy = map[string]int{}
		if got != want {
			t.Fatalf("idle pair, request %d: sent to %q, want %q (the other was given one last)", i, got, want)
		}
	}
}

// TestPickBatchSlots: in a pool that batches (max_batch 4), a worker's slot takes four
// batch items, so batch goes on filling the started batch of the worker with the most
// room for batch items; a latency item needs a slot no batch item holds.
func TestPickBatchSlots(t *testing.T) {
	c := snapOf(t, onePoolConfig("priority", "", ""))
	readyWorker(c, "bulk", "b1", 2, true, "batch")
	readyWorker(c, "bulk", "b2", 1, true, "batch")
	var got []string
	for i := 0; i < 13; i++ {
		got = append(got, c.pickWorker("bulk", "batch", "", false))
	}
	n := map[string]int{}
	for _, w := range got {
		n[w]++
	}
	if n["b1"] != 8 || n["b2"] != 4 || n[""] != 1 {
		t.Fatalf("12 batch items over 2+1 slots of 4: %v, want b1 8, b2 4, the 13th to the queue group", n)
	}
	w := &workerCap{slots: 2, classes: []string{"interactive", "batch"}, busy: map[string]int{"batch": 1}}
	if r := w.room("interactive", 4); r != 1 {
		t.Fatalf("one batch item in one of two slots: room for %d latency items, want 1", r)
	}
	if r := w.room("batch", 4); r != 7 {
		t.Fatalf("one batch item in one of two slots: room for %d batch items, want 7", r)
	}
	w.busy["interactive"] = 1
	if r := w.room("batch", 4); r != 3 {
		t.Fatalf("plus a latency item: room for %d batch items, want 3 (the started batch)", r)
	}
}

// TestPickSkipsOthers: a worker of another pool, one that does not serve the class, and
// one that does not take direct items are never picked (rule 1); with none left the item
// goes to the pool's queue group (rule 4).
func TestPickSkipsOthers(t *testing.T) {
	c := snapOf(t, onePoolConfig("priority", "", ""))
	readyWorker(c, "bulk", "b1", 4, true, "batch")
	readyWorker(c, "gpu", "g-old", 4, false, "urgent", "interactive", "batch")
	readyWorker(c, "gpu", "g-batch", 4, true, "batch")
	if got := c.pickWorker("gpu", "interactive", "", false); got != "" {
		t.Fatalf("picked %q, want the queue group", got)
	}
	if _, ok := c.workers["g-old"]; ok {
		t.Fatal("a worker without direct in the snapshot's direct workers")
	}
	if got := c.pickWorker("gpu", "batch", "", false); got != "g-batch" {
		t.Fatalf("batch: %q, want g-batch", got)
	}
}

// TestPrefetch: with both workers of pool gpu busy with batch, batch may send one item
// more to each (routed, and to the worker that has none queued yet), never a third; not
// for interactive; not while interactive is in flight or waits for the device, and, under
// the priority policy, not while it was active within the reserve window; under FIFO
// that window does not hold it back.
func TestPrefetch(t *testing.T) {
	busyPair := func(policy string) *capacity {
		c := snapOf(t, onePoolConfig(policy, "", "min_share = 0"))
		all := []string{"urgent", "interactive", "batch"}
		readyWorker(c, "gpu", "w1", 1, true, all...)
		readyWorker(c, "gpu", "w2", 1, true, all...)
		for _, w := range []string{"w1", "w2"} {
			c.take("gpu", "batch")
			c.workers[w].busy = map[string]int{"batch": 1}
		}
		return c
	}
	batch := func() *sched.Item { return newItem("batch", "tag", soon(), "gpu") }

	c := busyPair("priority")
	if n := c.prefetch("gpu", "batch", nil); n != 2 {
		t.Fatalf("prefetch room %d, want one per worker (2)", n)
	}
	if n := c.prefetch("gpu", "interactive", nil); n != 0 {
		t.Fatalf("interactive prefetch room %d, want 0", n)
	}
	d1, d2 := c.place(batch(), nil), c.place(batch(), nil)
	if d1.pool != "gpu" || d2.pool != "gpu" || d1.worker == d2.worker || d1.worker == "" || d2.worker == "" {
		t.Fatalf("two prefetched items went to %+v and %+v, want one to each worker", d1, d2)
	}
	if d := c.place(batch(), nil); d.pool != "" {
		t.Fatalf("a third item went to %+v, want a wait", d)
	}
	if d := nextPass(busyPair("priority")).place(newItem("interactive", "tag", soon(), "gpu"), nil); d.pool != "" {
		t.Fatalf("interactive prefetched to %+v", d)
	}

	c = busyPair("priority")
	c.load.add("cuda:0", "interactive", 1)
	if n := c.prefetch("gpu", "batch", nil); n != 0 {
		t.Fatalf("interactive in flight on the device: prefetch room %d, want 0", n)
	}
	c = busyPair("priority")
	if n := c.prefetch("gpu", "batch", map[string]bool{"gpu": true}); n != 0 {
		t.Fatalf("interactive waits for the device: prefetch room %d, want 0", n)
	}
	for _, policy := range []string{"priority", "fifo"} {
		c = busyPair(policy)
		c.active.see("cuda:0", "interactive", c.now.Add(-time.Second))
		if n, want := c.prefetch("gpu", "batch", nil), map[string]int{"priority": 0, "fifo": 2}[policy]; n != want {
			t.Fatalf("%s, interactive active 1s ago: prefetch room %d, want %d", policy, n, want)
		}
	}
}

// TestBumpPrefetched: a latency item goes to a worker whose one slot runs a batch item
// and which holds a prefetched one (its queue runs the latency item first), rather than
// wait in the gateway until the prefetched unit has started too (rule 4); only one such
// item per worker, and a worker with a free slot comes first.
func TestBumpPrefetched(t *testing.T) {
	c := snapOf(t, onePoolConfig("priority", "", "min_share = 0"))
	all := []string{"urgent", "interactive", "batch"}
	readyWorker(c, "gpu", "w1", 1, true, all...)
	c.pools["gpu"].busy = 2
	c.load.add("cuda:0", "batch", 2)
	c.workers["w1"].busy = map[string]int{"batch": 2}
	if d := c.place(newItem("interactive", "tag", soon(), "gpu"), nil); d.pool != "gpu" || d.worker != "w1" {
		t.Fatalf("interactive behind a running and a prefetched batch item: %+v, want sent to w1", d)
	}
	if d := c.place(newItem("urgent", "tag", soon(), "gpu"), nil); d.pool != "" {
		t.Fatalf("a second latency item went to %+v, want a wait", d)
	}
	c = nextPass(c)
	readyWorker(c, "gpu", "w2", 1, true, all...)
	c.workers["w1"].busy = map[string]int{"batch": 2}
	if d := c.place(newItem("urgent", "tag", soon(), "gpu"), nil); d.worker != "w2" {
		t.Fatalf("w2 free: urgent sent to %+v, want w2", d)
	}
	if d := c.place(newItem("batch", "tag", soon(), "gpu"), nil); d.pool != "" {
		t.Fatalf("batch went to %+v, want a wait (its prefetch is taken, and latency work is in flight)", d)
	}
}

// TestBumpOnlyInFirstLivePool: interactive's chain is fast, bulk, spare. With fast live
// and busy, and a worker of spare holding a running and a prefetched batch item, an
// interactive item waits for fast rather than bump into spare; with fast not live, spare's
// bump is taken (bulk has no live worker: spare is the first live pool).
func TestBumpOnlyInFirstLivePool(t *testing.T) {
	snap := func(fastLive bool) *capacity {
		c := snapOf(t, routeConfig)
		if fastLive {
			readyWorker(c, "fast", "f1", 1, true, "urgent", "interactive")
			c.take("fast", "interactive")
			c.workers["f1"].busy = map[string]int{"interactive": 1}
		}
		readyWorker(c, "spare", "s1", 1, true, "interactive", "batch")
		c.pools["spare"].busy = 2
		c.load.add("cpu", "batch", 2)
		c.workers["s1"].busy = map[string]int{"batch": 2}
		return c
	}
	if d := snap(true).place(newItem("interactive", "tag", soon(), "fast", "bulk", "spare"), nil); d.pool != "" || d.err != nil {
		t.Fatalf("fast live and busy: %+v, want a wait (no bump past it)", d)
	}
	if d := snap(false).place(newItem("interactive", "tag", soon(), "fast", "bulk", "spare"), nil); d.pool != "spare" || d.worker != "s1" {
		t.Fatalf("spare the first live pool: %+v, want a bump to s1", d)
	}
}
