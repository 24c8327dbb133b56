package gateway

import (
	"github.com/ortbus/ortbus/subjects"
)

// Worker selection: which worker of the pool a dispatch pass chose gets the item.
//
// A pool's workers share one NATS queue group (infer.<pool>.<class>), and NATS picks a
// member at random: an item sent there while one worker is busy and the other free lands
// on the busy one about half the time, and waits in its local queue behind the unit it
// runs while the other worker idles. So the gateway, which knows what it has in flight
// at each worker, sends each item to one worker alone (infer.<pool>.<class>.<worker>,
// which every worker whose heartbeat says `direct` serves), chosen by pickWorker:
//
//  1. Only live workers of the pool that serve the class and take direct items, and on
//     which the item's model did not fail to load (its heartbeat's model states).
//  2. The worker with the most room for the item wins: for the batch class in a pool
//     that batches, the batch items its free slots and its started batches can still
//     take; for every other item, its free slots. A worker's slot is taken by a request
//     of a latency class, or by up to max_batch batch requests. When the prefetch rule
//     (policy.go) lets the class hold one item more at each worker, each worker's room
//     for it is one more: a worker with a free slot still comes first.
//  3. Ties go to the worker with the fewest requests in flight, then to the one given a
//     request least recently (never: first; then the lowest id), so that idle workers
//     take turns, as in a queue group, and every worker's sessions stay warm.
//  4. A latency item may bump a prefetched batch item: when no worker has a free slot, it
//     goes to a worker that holds a prefetched batch unit and no latency item, whose
//     queue runs it first; without this, the prefetched unit would start before it, and
//     it would wait two batch units instead of one. Only in the first live pool of the
//     item's chain (route.go): past a live pool that is busy, the item waits for it.
//  5. When no worker has room (the pool-level count let the item through, but the room is
//     split between workers, or the workers do not take direct items), the item goes to
//     the pool's queue group, as before: it waits in some worker's local queue.

// hasRoom reports whether pool can take one more item of class now, without a bump
// (rule 4): a free slot of its live workers by the pool's count, a worker's own free slot
// (the pool's count also holds prefetched batch items, which take no slot from a latency
// item), or a prefetch (policy.go).
func (c *capacity) hasRoom(pool, class string, reserved map[string]bool) bool {
	if c.room(pool, class)+c.prefetch(pool, class, reserved) > 0 {
		return true
	}
	size := c.unitSize(pool, class)
	for _, w := range c.workers {
		if w.serves(pool, class) && w.room(class, size) > 0 {
			return true
		}
	}
	return false
}

// unitSize is how many items of class one slot of pool takes: the pool's max_batch for
// the batch class (slotSize), else one.
func (c *capacity) unitSize(pool, class string) int {
	if class == subjects.ClassBatch {
		return c.slotSize(pool)
	}
	return 1
}

// bumps is how many latency items of class pool may send to workers whose slots are
// taken, bumping their prefetched batch units (rule 4).
func (c *capacity) bumps(pool, class string) int {
	if class == subjects.ClassBatch {
		return 0
	}
	n := 0
	for _, w := range c.workers {
		if w.serves(pool, class) && w.bumpable(c.slotSize(pool)) {
			n++
		}
	}
	return n
}

// pickWorker returns the worker of pool an item of class and model is sent to, counting
// it in the snapshot, or "" for the pool's queue group (rule 5). prefetch gives each
// worker room for one item more.
func (c *capacity) pickWorker(pool, class, model string, prefetch bool) string {
	size := c.unitSize(pool, class)
	var best *workerCap
	bestID, bestRoom, bestBusy := "", 0, 0
	for id, w := range c.workers {
		if !w.serves(pool, class) || w.failed[model] {
			continue
		}
		// Scores: twice the room, so that a bump (score 1) comes after any free slot.
		room, busy := 2*w.room(class, size), w.inFlight()
		if prefetch {
			room += 2
		}
		if room <= 0 && class != subjects.ClassBatch && w.bumpable(c.slotSize(pool)) {
			room = 1
		}
		if room <= 0 {
			continue
		}
		better := best == nil || room > bestRoom
		if !better && room == bestRoom {
			better = busy < bestBusy || (busy == bestBusy && (w.lastSent < best.lastSent || (w.lastSent == best.lastSent && id < bestID)))
		}
		if better {
			best, bestID, bestRoom, bestBusy = w, id, room, busy
		}
	}
	if best == nil {
		return ""
	}
	if best.busy == nil {
		best.busy = map[string]int{}
	}
	best.busy[class]++
	c.sent++
	best.lastSent = c.sent
	return bestID
}
