package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models"
)

// lostBound only bounds a failure: a passing run never waits it out.
const lostBound = 10 * time.Second

// blockModel serves tag by waiting until the call's context ends; started receives once
// per call.
type blockModel struct {
	echoModel
	started chan struct{}
}

func (m blockModel) Run(ctx context.Context, _ string, items []models.Item) ([]codec.Replier, []error) {
	m.started <- struct{}{}
	<-ctx.Done()
	errs := make([]error, len(items))
	for i := range errs {
		errs[i] = ctx.Err()
	}
	return make([]codec.Replier, len(items)), errs
}

// TestServeConnStopsWhenConnectionClosed: a connection closed under a serving worker
// (not by its own drain) ends ServeConn at once with ErrConnectionLost, ctx still live:
// the running item is cancelled, the queued one dropped, nothing drained.
func TestServeConnStopsWhenConnectionClosed(t *testing.T) {
	w, nc := unitWorker(t)
	w.slots.n = 1
	started := make(chan struct{}, 4)
	serveReady(w.models, blockModel{started: started})
	ready := make(chan struct{})
	w.ready = func(*Worker) { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.ServeConn(ctx, nc) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("ServeConn returned before ready: %v", err)
	case <-time.After(lostBound):
		t.Fatal("not ready")
	}

	// The items come over the worker's own connection (the server echoes them to it).
	for _, id := range []string{"r1", "r2"} {
		b, _ := codec.Marshal(&codec.WorkItem{Request: codec.Request{ID: id, Path: "/srv/a.png", TimeoutMS: 60_000}, Op: "tag"})
		if err := nc.PublishRequest("infer.cpu.interactive", "_INBOX.lost."+id, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started: // r1 runs; r2 waits behind it in the one slot
	case <-time.After(lostBound):
		t.Fatal("the first item never ran")
	}

	nc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("ServeConn returned %v, want ErrConnectionLost", err)
		}
	case <-time.After(lostBound):
		t.Fatal("ServeConn still serves on a closed connection")
	}
	if queued, running, held := w.q.counts(); sum(queued)+sum(running) != 0 || len(held) != 0 {
		t.Errorf("after the loss: queued %v, running %v, held %v; want nothing", queued, running, held)
	}
}

// TestServeConnLostWhileDraining: a connection closed while the worker drains (its item
// still running) ends the drain at once with ErrConnectionLost, the item cancelled.
func TestServeConnLostWhileDraining(t *testing.T) {
	w, nc := unitWorker(t)
	w.slots.n = 1
	started := make(chan struct{}, 4)
	serveReady(w.models, blockModel{started: started})
	ready := make(chan struct{})
	w.ready = func(*Worker) { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.ServeConn(ctx, nc) }()
	select {
	case <-ready:
	case <-time.After(lostBound):
		t.Fatal("not ready")
	}
	b, _ := codec.Marshal(&codec.WorkItem{Request: codec.Request{ID: "r1", Path: "/srv/a.png", TimeoutMS: 60_000}, Op: "tag"})
	if err := nc.PublishRequest("infer.cpu.interactive", "_INBOX.lost.r1", b); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(lostBound):
		t.Fatal("the item never ran")
	}
	cancel()
	// The drain has begun when draining is set (no event says so).
	for deadline := time.Now().Add(lostBound); !w.serve.draining.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not begin")
		}
	}
	nc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("ServeConn returned %v, want ErrConnectionLost", err)
		}
	case <-time.After(lostBound):
		t.Fatal("the drain waits on a closed connection")
	}
}

// TestServeConnDrainsOnCancel: the worker's own stop (ctx) still drains and returns nil.
func TestServeConnDrainsOnCancel(t *testing.T) {
	w, nc := unitWorker(t)
	ready := make(chan struct{})
	w.ready = func(*Worker) { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.ServeConn(ctx, nc) }()
	select {
	case <-ready:
	case <-time.After(lostBound):
		t.Fatal("not ready")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeConn after its ctx ended: %v, want nil", err)
		}
	case <-time.After(lostBound):
		t.Fatal("ServeConn did not drain")
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
