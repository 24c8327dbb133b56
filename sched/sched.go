// Package sched holds the gateway's scheduling policy: per-class queues between a
// request's arrival and its dispatch to a pool. Work waits here, not in NATS buffers or
// worker queues, so that priority can still reorder it.
//
// The policy, each rule next to the code that enforces it below:
//
//  1. Strict priority between classes: a dispatch pass visits classes from the highest
//     priority (lowest number) down, so an urgent request is always offered a pool before
//     any queued interactive or batch request, and interactive before batch.
//  2. FIFO within a class, without head-of-line blocking across pools: an item that must
//     wait for its pool reserves that pool — no later item of its class or of a lower
//     class may take it in the same pass — while items bound for other pools go on. An
//     item kept from some of its pools by its own owner's choice (a tenant's pause of
//     its own work) reserves only the others (the Router answers Waits): it keeps nobody
//     else from the pools its owner chose not to use.
//  3. Bounded queues, explicit backpressure: a full class queue refuses a new request at
//     once (shed policy reject_new, answered overloaded) or drops its oldest waiting items
//     to make room (drop_oldest, for camera-frame-like work where the freshest matters).
//     A queue is full at Bound items or at MaxBytes bytes of requests, whichever comes
//     first, so a flood of large requests cannot grow the gateway's memory either.
//  4. Deadlines: an item whose deadline has passed is never dispatched; it is handed back
//     to be answered deadline_exceeded before it spends any compute.
//
// With FIFO set (the "fifo" policy, kept for comparison in benchmarks) rule 1 is off:
// a pass offers pools to items in arrival order whatever their class.
package sched

import (
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// Shed policies of a full class queue.
const (
	RejectNew  = "reject_new"
	DropOldest = "drop_oldest"
)

// Class describes one latency class.
type Class struct {
	Name     string
	Priority int   // lower runs first
	Bound    int   // most items that may wait
	MaxBytes int64 // most request bytes that may wait (0: no byte bound)
	Shed     string
}

// Item is one request waiting for dispatch.
type Item struct {
	ID       string
	Class    string
	Pools    []string  // candidate pools in order: the class's chain, or the one explicit pool
	Deadline time.Time // zero = none
	Bytes    int64     // the request's size, counted against the class's MaxBytes
	Value    any       // the gateway's own request state

	seq uint64 // arrival order, for FIFO
}

// Queues are the per-class queues. The zero value is not usable; call New.
type Queues struct {
	// FIFO turns strict class priority off (see the package comment).
	FIFO bool

	mu      sync.Mutex
	classes []Class
	q       map[string][]*Item
	bytes   map[string]int64 // bytes waiting per class
	seq     uint64
}

// New makes queues for classes, kept in priority order.
func New(classes []Class) *Queues {
	cs := append([]Class(nil), classes...)
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].Priority < cs[j].Priority })
	return &Queues{classes: cs, q: map[string][]*Item{}, bytes: map[string]int64{}}
}

func (s *Queues) class(name string) (Class, bool) {
	for _, c := range s.classes {
		if c.Name == name {
			return c, true
		}
	}
	return Class{}, false
}

// Push queues it at the back of its class. Rule 3: a full queue (by count or by bytes)
// refuses it with an overloaded error (reject_new), or admits it and returns the oldest
// items it dropped to make room (drop_oldest), which the caller answers overloaded.
func (s *Queues) Push(it *Item) (dropped []*Item, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.class(it.Class)
	if !ok {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q", it.Class)
	}
	q := s.q[it.Class]
	full := func() bool {
		return len(q) >= c.Bound || (c.MaxBytes > 0 && s.bytes[it.Class]+it.Bytes > c.MaxBytes)
	}
	if full() && (c.Shed != DropOldest || len(q) == 0 || (c.MaxBytes > 0 && it.Bytes > c.MaxBytes)) {
		return nil, codec.Errorf(codec.CodeOverloaded, "class %s queue is full (%d waiting, %d bytes)", c.Name, len(q), s.bytes[it.Class]).
			With("class", c.Name).With("bound", c.Bound).With("max_bytes", c.MaxBytes)
	}
	for full() && len(q) > 0 {
		dropped = append(dropped, q[0])
		s.bytes[it.Class] -= q[0].Bytes
		q[0] = nil
		q = q[1:]
	}
	s.seq++
	it.seq = s.seq
	s.q[it.Class] = append(q, it)
	s.bytes[it.Class] += it.Bytes
	return dropped, nil
}

// PushFront queues it at the front of its class, beyond the bounds: a retried request
// keeps its place in line.
func (s *Queues) PushFront(it *Item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.q[it.Class] = append([]*Item{it}, s.q[it.Class]...)
	s.bytes[it.Class] += it.Bytes
}

// Remove takes the item with id out of its queue (a cancel), or returns nil.
func (s *Queues) Remove(id string) *Item {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, q := range s.q {
		for i, it := range q {
			if it.ID == id {
				s.q[name] = append(q[:i:i], q[i+1:]...)
				s.bytes[name] -= it.Bytes
				return it
			}
		}
	}
	return nil
}

// Bytes is the size of the requests waiting in a class.
func (s *Queues) Bytes(class string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes[class]
}

// Len is the number of items waiting in a class.
func (s *Queues) Len(class string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.q[class])
}

// Drain empties every queue and returns what was waiting (for shutdown).
func (s *Queues) Drain() []*Item {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Item
	for _, c := range s.classes {
		out = append(out, s.q[c.Name]...)
		s.q[c.Name] = nil
		s.bytes[c.Name] = 0
	}
	return out
}

// Router decides where an item goes in a dispatch pass. It returns the pool to dispatch
// to (and counts it against that pool's room), or "" to keep the item waiting; reserved
// names the pools that higher-priority waiting items hold and that it must not use. An
// error answers the item now (no pool can ever serve it).
type Router func(it *Item, reserved map[string]bool) (pool string, err error)

// Waits is what a Router returns for an item that waits reserving only Pools of its
// candidates (rule 2's exception; none: it reserves nothing): it stays queued, and the
// items behind it may take its other pools.
type Waits struct{ Pools []string }

func (Waits) Error() string { return "sched: the item waits, reserving only some of its pools" }

// Assignment is an item leaving the queues for a pool.
type Assignment struct {
	Item *Item
	Pool string
}

// Failure is an item leaving the queues with an error to answer.
type Failure struct {
	Item *Item
	Err  error
}

// Dispatch runs one pass over the queues and removes what it dispatches or fails.
func (s *Queues) Dispatch(now time.Time, route Router) (out []Assignment, failed []Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	reserved := map[string]bool{}
	leaves := map[*Item]bool{}
	for _, it := range s.order() {
		if !it.Deadline.IsZero() && !now.Before(it.Deadline) { // rule 4
			failed = append(failed, Failure{it, codec.Errorf(codec.CodeDeadlineExceeded, "deadline passed while queued in class %s", it.Class)})
			leaves[it] = true
			continue
		}
		pool, err := route(it, reserved)
		var waits Waits
		switch {
		case errors.As(err, &waits):
			// Rule 2's exception: it waits, holding only these pools from everyone behind it.
			for _, p := range waits.Pools {
				reserved[p] = true
			}
		case err != nil:
			failed = append(failed, Failure{it, err})
			leaves[it] = true
		case pool != "":
			out = append(out, Assignment{it, pool})
			leaves[it] = true
		default:
			// Rule 2: it waits, and keeps its candidate pools from everyone behind it.
			for _, p := range it.Pools {
				reserved[p] = true
			}
		}
	}
	if len(leaves) > 0 {
		for name, q := range s.q {
			kept := q[:0]
			for _, it := range q {
				if !leaves[it] {
					kept = append(kept, it)
				} else {
					s.bytes[name] -= it.Bytes
				}
			}
			for i := len(kept); i < len(q); i++ {
				q[i] = nil
			}
			s.q[name] = kept
		}
	}
	return out, failed
}

// order is the order in which a pass visits the waiting items: by class priority, then
// arrival (rule 1 and 2), or by arrival alone under FIFO. Called with mu held.
func (s *Queues) order() []*Item {
	var all []*Item
	for _, c := range s.classes {
		all = append(all, s.q[c.Name]...)
	}
	if s.FIFO {
		sort.SliceStable(all, func(i, j int) bool { return all[i].seq < all[j].seq })
	}
	return all
}
