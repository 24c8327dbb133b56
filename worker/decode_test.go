package worker

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models"
)

// decodeModel's Prepare tells each start on started (its path) and, when its path has a
// gate, waits until the gate is closed; a path "/srv/panic" panics. It counts Prepare
// calls per path.
type decodeModel struct {
	echoModel
	started chan string
	gates   map[string]chan struct{}
	// during, if set, is called at each Prepare's start (the decoder's invariants).
	during func(path string)
	mu     sync.Mutex
	calls  map[string]int
}

func (m *decodeModel) Prepare(_ string, req *codec.WorkItem) (models.Item, error) {
	m.mu.Lock()
	m.calls[req.Path]++
	m.mu.Unlock()
	if m.during != nil {
		m.during(req.Path)
	}
	if m.started != nil {
		m.started <- req.Path
	}
	if g := m.gates[req.Path]; g != nil {
		<-g
	}
	if req.Path == "/srv/panic" {
		panic("a decoder broke")
	}
	return "decoded " + req.Path, nil
}

func (m *decodeModel) count(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[path]
}

// decodeRig is a decoder over real queues (classes interactive and batch, no batching)
// with the model m, its goroutines not started.
func decodeRig(t *testing.T, m *decodeModel, threads, bound int) (*decoder, *queues) {
	t.Helper()
	if m.calls == nil {
		m.calls = map[string]int{}
	}
	q := newQueues([]string{"interactive", "batch"}, 16, 1, 0)
	d := newDecoder(slog.New(slog.NewTextHandler(io.Discard, nil)), q.upcoming, threads, bound)
	q.changed = d.wake
	return d, q
}

// queue puts a job for path in class, with a context of its own, and returns it.
func queue(t *testing.T, q *queues, m models.Model, class, path string) *job {
	t.Helper()
	j := &job{item: &codec.WorkItem{Request: codec.Request{ID: path, Path: path}}, op: "tag", class: class, model: m, received: time.Now()}
	j.ctx, j.cancel = context.WithCancel(context.Background())
	t.Cleanup(j.cancel)
	if !q.put(j) {
		t.Fatalf("queue refused %s", path)
	}
	return j
}

// The decode stage's rules 3 to 5, step by step (no goroutines): the jobs picked ahead
// come in the slots' order (priority first), never more than the bound held; a job
// cancelled before its decode is never decoded, one decoded ahead and cancelled is
// dropped (its input released, its place freed); a claim frees a place.
func TestDecoderPickBound(t *testing.T) {
	m := &decodeModel{}
	d, q := decodeRig(t, m, 0, 2)
	b1 := queue(t, q, m, "batch", "/srv/b1")
	b2 := queue(t, q, m, "batch", "/srv/b2")
	b3 := queue(t, q, m, "batch", "/srv/b3")
	i1 := queue(t, q, m, "interactive", "/srv/i1")

	ahead := func(want *job) {
		t.Helper()
		j := d.pick()
		if j != want {
			t.Fatalf("picked %v, want %v", name(j), name(want))
		}
		if j != nil {
			d.decode(j)
			d.finish(j)
		}
		if n := len(d.ahead); n > d.bound {
			t.Fatalf("%d held ahead, bound %d", n, d.bound)
		}
	}
	ahead(i1) // the interactive class first
	ahead(b1)
	ahead(nil) // two held: the bound

	b2.cancel() // cancelled while queued: never decoded
	i1.cancel() // cancelled after its decode: dropped
	ahead(b3)
	if i1.dec != decDropped || i1.prepared != nil {
		t.Fatalf("i1 cancelled after its decode: state %d, input %v; want dropped, released", i1.dec, i1.prepared)
	}
	if _, err := d.claim(i1); codec.CodeOf(err) != codec.CodeCancelled {
		t.Fatalf("claim of a dropped job: %v, want cancelled", err)
	}
	ahead(nil) // b1 and b3 held

	// A slot takes b1 and claims it: decoded once, ahead; its place is free again.
	if u := q.take(); len(u) != 1 || u[0] != i1 {
		t.Fatalf("took %v, want i1 first", u)
	}
	if u := q.take(); len(u) != 1 || u[0] != b1 {
		t.Fatalf("took %v, want b1", u)
	}
	if it, err := d.claim(b1); err != nil || it != "decoded /srv/b1" {
		t.Fatalf("claim b1: %v, %v", it, err)
	}
	b4 := queue(t, q, m, "batch", "/srv/b4")
	ahead(b4)
	for path, want := range map[string]int{"/srv/i1": 1, "/srv/b1": 1, "/srv/b2": 0, "/srv/b3": 1, "/srv/b4": 1} {
		if got := m.count(path); got != want {
			t.Errorf("%s decoded %d times, want %d", path, got, want)
		}
	}
	// A job nobody decoded ahead is decoded by its slot's claim.
	b5 := queue(t, q, m, "batch", "/srv/b5")
	if it, err := d.claim(b5); err != nil || it != "decoded /srv/b5" || m.count("/srv/b5") != 1 {
		t.Fatalf("claim of a job not decoded ahead: %v, %v (%d decodes)", it, err, m.count("/srv/b5"))
	}
}

func name(j *job) string {
	if j == nil {
		return "none"
	}
	return j.item.Path
}

// With goroutines: three decode goroutines and a bound of two never hold more than two
// ahead (checked at every decode's start); each claim lets the next job in order start;
// a panic in one decode is that job's internal error, the goroutines go on; every job is
// decoded once.
func TestDecoderGoroutinesBound(t *testing.T) {
	paths := []string{"/srv/0", "/srv/1", "/srv/panic", "/srv/3", "/srv/4", "/srv/5"}
	m := &decodeModel{started: make(chan string, 16), gates: map[string]chan struct{}{}}
	for _, p := range paths {
		m.gates[p] = make(chan struct{})
	}
	d, q := decodeRig(t, m, 3, 2)
	var over []int
	m.during = func(string) {
		d.mu.Lock()
		if n := len(d.ahead); n > d.bound {
			over = append(over, n)
		}
		d.mu.Unlock()
	}
	jobs := map[string]*job{}
	for _, p := range paths {
		jobs[p] = queue(t, q, m, "batch", p)
	}
	d.start()
	released := map[string]bool{}
	release := func(p string) { // with the test's goroutine only
		if !released[p] {
			released[p] = true
			close(m.gates[p])
		}
	}
	defer d.stop()
	defer func() { // a decode still held returns, so that stop ends
		for _, p := range paths {
			release(p)
		}
	}()
	next := func(want string) {
		t.Helper()
		select {
		case p := <-m.started:
			if p != want {
				t.Fatalf("decode started for %s, want %s (the slots' order)", p, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no decode started, want %s", want)
		}
	}
	// The first two start together, in either order.
	first := map[string]bool{<-m.started: true, <-m.started: true}
	if !first["/srv/0"] || !first["/srv/1"] {
		t.Fatalf("first decodes %v, want /srv/0 and /srv/1", first)
	}
	for i, p := range paths {
		// Two are held ahead; no third starts until a slot claims one (its claim
		// waits for the decode the goroutine started).
		release(p)
		u := q.take()
		if len(u) != 1 || u[0] != jobs[p] {
			t.Fatalf("slot took %v, want %s", u, p)
		}
		it, err := d.claim(u[0])
		if p == "/srv/panic" {
			if codec.CodeOf(err) != codec.CodeInternal {
				t.Fatalf("a panicking decode: %v, %v; want internal", it, err)
			}
		} else if err != nil || it != "decoded "+p {
			t.Fatalf("claim %s: %v, %v", p, it, err)
		}
		if i+2 < len(paths) {
			next(paths[i+2])
		}
	}
	for _, p := range paths {
		if n := m.count(p); n != 1 {
			t.Errorf("%s decoded %d times, want once", p, n)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(over) > 0 {
		t.Fatalf("held ahead beyond the bound: %v", over)
	}
	if len(d.ahead) != 0 {
		t.Fatalf("%d still held ahead after every claim", len(d.ahead))
	}
}

// A job decoded ahead whose deadline passes before a slot claims it is dropped (its
// context wakes the decoder: no queue change needed), and its place goes to the next.
func TestDecoderDropsExpired(t *testing.T) {
	m := &decodeModel{started: make(chan string, 16)}
	d, q := decodeRig(t, m, 1, 1)
	first := queue(t, q, m, "batch", "/srv/first")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first.ctx = ctx // expires when cancel is called below
	queue(t, q, m, "batch", "/srv/second")
	d.start()
	defer d.stop()
	if p := <-m.started; p != "/srv/first" {
		t.Fatalf("first decode %s", p)
	}
	cancel()
	select {
	case p := <-m.started:
		if p != "/srv/second" {
			t.Fatalf("after the first expired, decoded %s", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the expired job's place was not freed")
	}
	if _, err := d.claim(first); codec.CodeOf(err) != codec.CodeCancelled {
		t.Fatalf("claim of the expired job: %v", err)
	}
}
