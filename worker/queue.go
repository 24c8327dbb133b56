package worker

import (
	"sync"
	"time"

	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/subjects"
)

// queues holds the worker's local per-class queues, which the slots (slots.go) take their
// units of work from. Its policy, enforced in take:
//   - strict priority: a slot always takes from the highest-priority class with work;
//   - FIFO within a class;
//   - bounded: put refuses an item when its class already holds `bound` items, and the
//     caller answers overloaded at once (NATS never drops work silently);
//   - dynamic batching (batch class only): a slot that takes a batchable item gathers up to
//     maxBatch items of the same model and op — fewer when the model's cap (memory, its
//     network's batch dimension: models.Limit) is lower — waiting at most maxDelay for
//     them.
type queues struct {
	mu       sync.Mutex
	cond     *sync.Cond
	order    []string // classes, highest priority first
	q        map[string][]*job
	running  map[string]int
	held     map[string]*job // by request id: queued and running
	bound    int
	maxBatch int
	caps     map[string]int // per model: its batch cap (memory admission), if lower
	maxDelay time.Duration
	closed   bool
	// changed, if set, is told (with mu held: it must not block) whenever a job is
	// queued or leaves the queues: the decode stage looks again at what comes next.
	changed func()
}

func newQueues(order []string, bound, maxBatch int, maxDelay time.Duration) *queues {
	q := &queues{order: order, q: map[string][]*job{}, running: map[string]int{}, held: map[string]*job{}, caps: map[string]int{}, bound: bound, maxBatch: maxBatch, maxDelay: maxDelay}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// put enqueues j, or reports false when its class queue is full or the worker is closing.
func (q *queues) put(j *job) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || len(q.q[j.class]) >= q.bound {
		return false
	}
	q.q[j.class] = append(q.q[j.class], j)
	if j.item.ID != "" {
		q.held[j.item.ID] = j
	}
	q.cond.Broadcast()
	q.notify()
	return true
}

// take blocks until work is available and returns the next unit: one job, or several of
// the same model and op for a dynamic batch. It returns nil when closed and empty.
func (q *queues) take() []*job {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		for _, class := range q.order {
			if len(q.q[class]) == 0 {
				continue
			}
			first := q.pop(class, 0)
			unit := []*job{first}
			if class == subjects.ClassBatch && q.maxBatch > 1 && first.model.Batchable(first.op) {
				unit = q.gather(unit)
			}
			q.running[class] += len(unit)
			return unit
		}
		if q.closed {
			return nil
		}
		q.cond.Wait()
	}
}

// upcoming returns up to n queued jobs that the slots will run, in the order they will
// take them (the highest-priority class first, FIFO within it), without taking them: a
// job whose context has ended (cancelled, past its deadline) is passed over, as a slot
// only answers it.
func (q *queues) upcoming(n int) []*job {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*job
	for _, class := range q.order {
		for _, j := range q.q[class] {
			if len(out) >= n {
				return out
			}
			if j.ctx == nil || j.ctx.Err() == nil {
				out = append(out, j)
			}
		}
	}
	return out
}

// notify tells the watcher (changed) that the queues changed. Called with mu held.
func (q *queues) notify() {
	if q.changed != nil {
		q.changed()
	}
}

// gather adds queued items of the same model and op to a batch, waiting up to maxDelay
// for more to arrive. Called with mu held.
func (q *queues) gather(unit []*job) []*job {
	first := unit[0]
	limit := q.maxBatch
	if c := q.caps[first.model.Name()]; c > 0 {
		limit = min(limit, c)
	}
	// Never more than this copy of the model takes in one call (models.Limit): the cap
	// set for its name may be a newer copy's while a reload swaps.
	limit = models.Limit(first.model, limit)
	until := time.Now().Add(q.maxDelay)
	timer := time.AfterFunc(q.maxDelay, func() {
		q.mu.Lock()
		q.cond.Broadcast()
		q.mu.Unlock()
	})
	defer timer.Stop()
	for {
		for i := 0; i < len(q.q[first.class]) && len(unit) < limit; {
			j := q.q[first.class][i]
			if j.model == first.model && j.op == first.op {
				unit = append(unit, q.pop(first.class, i))
				continue
			}
			i++
		}
		if len(unit) >= limit || q.closed || !time.Now().Before(until) || q.higherWaiting(first.class) {
			return unit
		}
		q.cond.Wait()
	}
}

// setCap sets model's batch cap (memory admission: a model loaded in place), or clears
// it (n <= 0).
func (q *queues) setCap(model string, n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n > 0 {
		q.caps[model] = n
	} else {
		delete(q.caps, model)
	}
}

// higherWaiting reports whether a class above class has queued work. Called with mu held.
func (q *queues) higherWaiting(class string) bool {
	for _, c := range q.order {
		if c == class {
			return false
		}
		if len(q.q[c]) > 0 {
			return true
		}
	}
	return false
}

func (q *queues) pop(class string, i int) *job {
	s := q.q[class]
	j := s[i]
	q.q[class] = append(s[:i:i], s[i+1:]...)
	q.notify()
	return j
}

// done marks jobs finished.
func (q *queues) done(unit []*job) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range unit {
		q.running[j.class]--
		if j.item.ID != "" && q.held[j.item.ID] == j {
			delete(q.held, j.item.ID)
		}
	}
	q.cond.Broadcast()
}

// cancel removes a queued job by id and returns it (to be answered cancelled), or cancels
// a running one's context and returns nil; found reports whether id was held at all.
func (q *queues) cancel(id string) (queued *job, found bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	j, ok := q.held[id]
	if !ok {
		return nil, false
	}
	for i, x := range q.q[j.class] {
		if x == j {
			q.pop(j.class, i)
			delete(q.held, id)
			q.cond.Broadcast()
			return j, true
		}
	}
	j.cancel()
	return nil, true
}

// close stops take from blocking once the queues are empty.
func (q *queues) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// idle waits until nothing is queued or running.
func (q *queues) idle() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		busy := false
		for _, c := range q.order {
			if len(q.q[c]) > 0 || q.running[c] > 0 {
				busy = true
			}
		}
		if !busy {
			return
		}
		q.cond.Wait()
	}
}

// counts returns per-class queued and running counts and the held request ids.
func (q *queues) counts() (queued, running map[string]int, held []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	queued, running = map[string]int{}, map[string]int{}
	for _, c := range q.order {
		queued[c] = len(q.q[c])
		running[c] = q.running[c]
	}
	for id := range q.held {
		held = append(held, id)
	}
	return queued, running, held
}
