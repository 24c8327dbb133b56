package gateway

import (
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/health"
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
	if got := c.pickWorker("gpu", "batch"); got != "w1" {
		t.Fatalf("both free: %q, want w1 (lower id)", got)
	}
	if got := c.pickWorker("gpu", "interactive"); got != "w2" {
		t.Fatalf("w1 runs a batch item: interactive sent to %q, want w2", got)
	}
	if got := c.pickWorker("gpu", "urgent"); got != "" {
		t.Fatalf("both busy: urgent sent to %q, want the queue group", got)
	}
	if c.workers["w1"].busy["batch"] != 1 || c.workers["w2"].busy["interactive"] != 1 {
		t.Fatalf("counted %v %v, want w1 one batch, w2 one interactive", c.workers["w1"].busy, c.workers["w2"].busy)
	}
	c.workers["w1"].busy = map[string]int{}
	if got := c.pickWorker("gpu", "urgent"); got != "w1" {
		t.Fatalf("w1 free again: urgent sent to %q, want w1", got)
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
		got = append(got, c.pickWorker("bulk", "batch"))
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
	if got := c.pickWorker("gpu", "interactive"); got != "" {
		t.Fatalf("picked %q, want the queue group", got)
	}
	if _, ok := c.workers["g-old"]; ok {
		t.Fatal("a worker without direct in the snapshot's direct workers")
	}
	if got := c.pickWorker("gpu", "batch"); got != "g-batch" {
		t.Fatalf("batch: %q, want g-batch", got)
	}
}
