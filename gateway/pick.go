package gateway

import (
	"slices"

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
//  1. Only live workers of the pool that serve the class and take direct items.
//  2. The worker with the most room for the item wins: for the batch class in a pool
//     that batches, the batch items its free slots and its started batches can still
//     take; for every other item, its free slots. A worker's slot is taken by a request
//     of a latency class, or by up to max_batch batch requests.
//  3. Ties go to the worker with the fewest requests in flight, then to the lowest id, so
//     that the choice is the same for the same state.
//  4. When no worker has room (the pool-level count let the item through, but the room is
//     split between workers, or the workers do not take direct items), the item goes to
//     the pool's queue group, as before: it waits in some worker's local queue.

// workerCap is one live worker in a capacity snapshot that takes items sent to it alone.
type workerCap struct {
	pool    string
	slots   int            // max(1, its heartbeat's slots)
	classes []string       // the classes it serves
	busy    map[string]int // requests in flight sent to it, per class, this pass's included
}

// room is how many more items of class w can start now: rule 2.
func (w *workerCap) room(class string, size int) int {
	batch, other := 0, 0
	for cl, n := range w.busy {
		if cl == subjects.ClassBatch {
			batch += n
		} else {
			other += n
		}
	}
	if class == subjects.ClassBatch {
		return (w.slots-other)*size - batch
	}
	return w.slots - other - (batch+size-1)/size
}

func (w *workerCap) inFlight() int {
	n := 0
	for _, v := range w.busy {
		n += v
	}
	return n
}

// pickWorker returns the worker of pool an item of class is sent to, counting it in the
// snapshot, or "" for the pool's queue group (rule 4).
func (c *capacity) pickWorker(pool, class string) string {
	size := 1
	if class == subjects.ClassBatch {
		size = c.slotSize(pool)
	}
	best, bestRoom, bestBusy := "", 0, 0
	for id, w := range c.workers {
		if w.pool != pool || !slices.Contains(w.classes, class) {
			continue
		}
		room, busy := w.room(class, size), w.inFlight()
		if room <= 0 {
			continue
		}
		if best == "" || room > bestRoom || (room == bestRoom && (busy < bestBusy || (busy == bestBusy && id < best))) {
			best, bestRoom, bestBusy = id, room, busy
		}
	}
	if best != "" {
		w := c.workers[best]
		if w.busy == nil {
			w.busy = map[string]int{}
		}
		w.busy[class]++
	}
	return best
}
