package sched

import (
	"fmt"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

func classes() []Class {
	return []Class{
		{Name: "batch", Priority: 2, Bound: 100, Shed: RejectNew},
		{Name: "urgent", Priority: 0, Bound: 2, Shed: DropOldest},
		{Name: "interactive", Priority: 1, Bound: 3, Shed: RejectNew},
	}
}

// rooms is a Router over pools with a fixed number of free slots.
func rooms(free map[string]int) Router {
	return func(it *Item, reserved map[string]bool) (string, error) {
		for _, p := range it.Pools {
			if !reserved[p] && free[p] > 0 {
				free[p]--
				return p, nil
			}
		}
		return "", nil
	}
}

func ids(as []Assignment) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Item.ID)
	}
	return out
}

func TestStrictPriority(t *testing.T) {
	q := New(classes())
	for _, it := range []*Item{
		{ID: "b1", Class: "batch", Pools: []string{"gpu"}},
		{ID: "b2", Class: "batch", Pools: []string{"gpu"}},
		{ID: "i1", Class: "interactive", Pools: []string{"gpu"}},
		{ID: "u1", Class: "urgent", Pools: []string{"gpu"}},
	} {
		if _, err := q.Push(it); err != nil {
			t.Fatal(err)
		}
	}
	// One slot: the urgent item goes first even though it arrived last.
	out, _ := q.Dispatch(time.Now(), rooms(map[string]int{"gpu": 1}))
	if got := ids(out); len(got) != 1 || got[0] != "u1" {
		t.Fatalf("first dispatch %v, want [u1]", got)
	}
	out, _ = q.Dispatch(time.Now(), rooms(map[string]int{"gpu": 1}))
	if got := ids(out); len(got) != 1 || got[0] != "i1" {
		t.Fatalf("second dispatch %v, want [i1]", got)
	}
	out, _ = q.Dispatch(time.Now(), rooms(map[string]int{"gpu": 5}))
	if got := ids(out); len(got) != 2 || got[0] != "b1" || got[1] != "b2" {
		t.Fatalf("batch dispatch %v, want FIFO [b1 b2]", got)
	}
}

func TestReservationAcrossPools(t *testing.T) {
	q := New(classes())
	q.Push(&Item{ID: "i1", Class: "interactive", Pools: []string{"gpu"}})
	q.Push(&Item{ID: "b1", Class: "batch", Pools: []string{"gpu"}})
	q.Push(&Item{ID: "b2", Class: "batch", Pools: []string{"cpu"}})
	// gpu is full: i1 waits and reserves gpu, so b1 may not jump it when a gpu slot
	// appears in the same pass; b2 is bound elsewhere and goes on.
	free := map[string]int{"gpu": 0, "cpu": 1}
	route := func(it *Item, reserved map[string]bool) (string, error) {
		if it.ID == "b1" && !reserved["gpu"] {
			t.Fatal("b1 was offered gpu while a higher-priority item waits for it")
		}
		return rooms(free)(it, reserved)
	}
	out, _ := q.Dispatch(time.Now(), route)
	if got := ids(out); len(got) != 1 || got[0] != "b2" {
		t.Fatalf("dispatch %v, want [b2]", got)
	}
	if q.Len("interactive") != 1 || q.Len("batch") != 1 {
		t.Fatal("waiting items were lost")
	}
}

// Rule 2's exception: an item whose Router answers Waits stays queued and reserves only
// the pools named, so the items behind it (of its class and below) take its others.
func TestWaitsReservesOnlyItsPools(t *testing.T) {
	q := New(classes())
	q.Push(&Item{ID: "b1", Class: "batch", Pools: []string{"gpu", "cpu"}})
	q.Push(&Item{ID: "b2", Class: "batch", Pools: []string{"gpu"}})
	q.Push(&Item{ID: "b3", Class: "batch", Pools: []string{"cpu"}})
	free := map[string]int{"gpu": 1, "cpu": 1}
	route := func(it *Item, reserved map[string]bool) (string, error) {
		if it.ID == "b1" {
			return "", Waits{Pools: []string{"cpu"}} // kept from gpu by its owner
		}
		return rooms(free)(it, reserved)
	}
	out, failed := q.Dispatch(time.Now(), route)
	if got := ids(out); len(got) != 1 || got[0] != "b2" || len(failed) != 0 {
		t.Fatalf("dispatch %v (failed %v), want [b2] on gpu, b3 behind b1's reservation of cpu", got, failed)
	}
	if q.Len("batch") != 2 {
		t.Fatal("a waiting item left the queue")
	}
}

func TestBoundsAndShed(t *testing.T) {
	q := New(classes())
	for i := 0; i < 3; i++ {
		if _, err := q.Push(&Item{ID: string(rune('a' + i)), Class: "interactive"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := q.Push(&Item{ID: "x", Class: "interactive"})
	if codec.CodeOf(err) != codec.CodeOverloaded {
		t.Fatalf("full reject_new queue: %v", err)
	}
	q.Push(&Item{ID: "u1", Class: "urgent"})
	q.Push(&Item{ID: "u2", Class: "urgent"})
	dropped, err := q.Push(&Item{ID: "u3", Class: "urgent"})
	if err != nil || len(dropped) != 1 || dropped[0].ID != "u1" {
		t.Fatalf("drop_oldest: dropped %v, err %v", dropped, err)
	}
	if q.Len("urgent") != 2 {
		t.Fatalf("urgent len %d", q.Len("urgent"))
	}
	if _, err := q.Push(&Item{ID: "z", Class: "nope"}); codec.CodeOf(err) != codec.CodeBadRequest {
		t.Fatalf("unknown class: %v", err)
	}
}

// Rule 3 by bytes: a class is also full at MaxBytes of waiting requests; an item leaving
// the queue (dispatched, removed, dropped) gives its bytes back.
func TestByteBound(t *testing.T) {
	q := New([]Class{{Name: "batch", Priority: 2, Bound: 100, MaxBytes: 1000, Shed: RejectNew},
		{Name: "urgent", Priority: 0, Bound: 100, MaxBytes: 1000, Shed: DropOldest}})
	for i := 0; i < 3; i++ {
		if _, err := q.Push(&Item{ID: fmt.Sprint("b", i), Class: "batch", Bytes: 300}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Push(&Item{ID: "b3", Class: "batch", Bytes: 200}); codec.CodeOf(err) != codec.CodeOverloaded {
		t.Fatalf("1100 bytes in a 1000-byte queue: %v", err)
	}
	if q.Bytes("batch") != 900 || q.Len("batch") != 3 {
		t.Fatalf("refused item counted: %d bytes, %d items", q.Bytes("batch"), q.Len("batch"))
	}
	q.Remove("b0")
	if _, err := q.Push(&Item{ID: "b3", Class: "batch", Bytes: 400}); err != nil {
		t.Fatalf("room after a remove: %v", err)
	}
	out, _ := q.Dispatch(time.Now(), func(it *Item, _ map[string]bool) (string, error) { return "p", nil })
	if len(out) != 3 || q.Bytes("batch") != 0 {
		t.Fatalf("dispatched %d, %d bytes left", len(out), q.Bytes("batch"))
	}
	// drop_oldest drops as many as it takes; an item alone over the bound is refused.
	q.Push(&Item{ID: "u1", Class: "urgent", Bytes: 400})
	q.Push(&Item{ID: "u2", Class: "urgent", Bytes: 400})
	dropped, err := q.Push(&Item{ID: "u3", Class: "urgent", Bytes: 900})
	if err != nil || len(dropped) != 2 || q.Bytes("urgent") != 900 {
		t.Fatalf("drop_oldest by bytes: dropped %d, err %v, %d bytes", len(dropped), err, q.Bytes("urgent"))
	}
	if _, err := q.Push(&Item{ID: "u4", Class: "urgent", Bytes: 1001}); codec.CodeOf(err) != codec.CodeOverloaded || q.Len("urgent") != 1 {
		t.Fatalf("an item over the whole bound: %v, %d left", err, q.Len("urgent"))
	}
}

func TestDeadlinesAndRemove(t *testing.T) {
	q := New(classes())
	now := time.Now()
	q.Push(&Item{ID: "late", Class: "batch", Pools: []string{"gpu"}, Deadline: now.Add(-time.Millisecond)})
	q.Push(&Item{ID: "ok", Class: "batch", Pools: []string{"gpu"}, Deadline: now.Add(time.Hour)})
	q.Push(&Item{ID: "gone", Class: "batch", Pools: []string{"gpu"}})
	if it := q.Remove("gone"); it == nil || it.ID != "gone" {
		t.Fatal("Remove")
	}
	out, failed := q.Dispatch(now, rooms(map[string]int{"gpu": 5}))
	if len(failed) != 1 || failed[0].Item.ID != "late" || codec.CodeOf(failed[0].Err) != codec.CodeDeadlineExceeded {
		t.Fatalf("failed %+v", failed)
	}
	if got := ids(out); len(got) != 1 || got[0] != "ok" {
		t.Fatalf("out %v", got)
	}
	q.PushFront(&Item{ID: "retry", Class: "batch"})
	q.Push(&Item{ID: "new", Class: "batch"})
	if d := q.Drain(); len(d) != 2 || d[0].ID != "retry" {
		t.Fatalf("drain %v", d)
	}
}

func TestFIFOPolicy(t *testing.T) {
	q := New(classes())
	q.FIFO = true
	q.Push(&Item{ID: "b1", Class: "batch", Pools: []string{"gpu"}})
	q.Push(&Item{ID: "u1", Class: "urgent", Pools: []string{"gpu"}})
	out, _ := q.Dispatch(time.Now(), rooms(map[string]int{"gpu": 1}))
	if got := ids(out); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("FIFO dispatch %v, want the first arrival [b1]", got)
	}
	// A retry pushed to the front keeps the front under FIFO too.
	q.PushFront(&Item{ID: "r1", Class: "batch", Pools: []string{"gpu"}})
	out, _ = q.Dispatch(time.Now(), rooms(map[string]int{"gpu": 1}))
	if got := ids(out); len(got) != 1 || got[0] != "r1" {
		t.Fatalf("FIFO after retry %v, want [r1]", got)
	}
}
