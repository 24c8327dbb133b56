package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models"
)

// gateModel counts Prepare calls per path and holds each Run until released.
type gateModel struct {
	echoModel
	mu       sync.Mutex
	prepared map[string]int
	prepCh   chan string   // each Prepare's path
	running  chan string   // each Run's first path, as it starts
	release  chan struct{} // one per Run
	stop     chan struct{} // closed at the end of the test: every Run returns
}

func (m *gateModel) Prepare(_ string, req *codec.WorkItem) (models.Item, error) {
	m.mu.Lock()
	m.prepared[req.Path]++
	m.mu.Unlock()
	m.prepCh <- req.Path
	return req.Path, nil
}

func (m *gateModel) Run(ctx context.Context, op string, items []models.Item) ([]codec.Replier, []error) {
	m.running <- items[0].(string)
	select {
	case <-m.release:
	case <-m.stop:
	}
	return m.echoModel.Run(ctx, op, items)
}

// TestPrepareAhead: while a slot runs one item, the item it takes next is prepared (its
// image decoded) ahead by the decode stage, once; both are answered once.
func TestPrepareAhead(t *testing.T) {
	w, nc := unitWorker(t)
	m := &gateModel{prepared: map[string]int{}, prepCh: make(chan string, 8), running: make(chan string, 8), release: make(chan struct{}, 8), stop: make(chan struct{})}
	serveReady(w.models, m)
	replies, err := nc.SubscribeSync("_INBOX.ahead.>")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/srv/a.png", "/srv/b.png"} {
		b, _ := codec.Marshal(&codec.WorkItem{Request: codec.Request{ID: p[5:6], Path: p, Model: "tagger", Class: "batch"}, Op: "tag"})
		w.serve.accept("batch", &nats.Msg{Subject: "infer.cpu.batch", Reply: "_INBOX.ahead." + p[5:6], Data: b})
	}
	if n, _, _ := replies.Pending(); n > 0 {
		r, _ := replies.NextMsg(time.Second)
		t.Fatalf("answered at once: %s %q", r.Header, r.Data)
	}
	done := make(chan struct{})
	w.slots.decode.start()
	go func() { defer close(done); w.slots.slot() }()
	defer func() { close(m.stop); w.q.close(); <-done; w.slots.decode.stop() }()

	wait := func(ch chan string, what string) string {
		t.Helper()
		select {
		case s := <-ch:
			return s
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s", what)
			return ""
		}
	}
	if p := wait(m.prepCh, "prepare of the first item"); p != "/srv/a.png" {
		t.Fatalf("first prepared %s", p)
	}
	if p := wait(m.running, "run of the first item"); p != "/srv/a.png" {
		t.Fatalf("first run %s", p)
	}
	// a.png's run is held: b.png is prepared meanwhile.
	if p := wait(m.prepCh, "prepare of the next item while the first runs"); p != "/srv/b.png" {
		t.Fatalf("prepared ahead %s, want /srv/b.png", p)
	}
	m.release <- struct{}{}
	if p := wait(m.running, "run of the second item"); p != "/srv/b.png" {
		t.Fatalf("second run %s", p)
	}
	m.release <- struct{}{}
	for i := 0; i < 2; i++ {
		if _, err := replies.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("reply %d: %v", i+1, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prepared["/srv/a.png"] != 1 || m.prepared["/srv/b.png"] != 1 {
		t.Fatalf("prepare calls %v, want one each", m.prepared)
	}
}
