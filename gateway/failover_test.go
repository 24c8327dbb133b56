package gateway

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// fakeKV is an answers bucket whose reads wait until released (or their context ends),
// then answer with get. Each read is signalled on started as it begins.
type fakeKV struct {
	jetstream.KeyValue
	release chan struct{}
	started chan struct{}
	get     func(key string) (jetstream.KeyValueEntry, error)
}

func newFakeKV() *fakeKV {
	return &fakeKV{release: make(chan struct{}), started: make(chan struct{}, resendReaders+resendBacklog)}
}

func (kv *fakeKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	select {
	case kv.started <- struct{}{}:
	default: // more reads than the tests wait for
	}
	select {
	case <-kv.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return kv.get(key)
}

type fakeEntry struct {
	jetstream.KeyValueEntry
	value []byte
}

func (e fakeEntry) Value() []byte { return e.value }

// onSubject is a fakeRequest received on an API subject.
type onSubject struct {
	*fakeRequest
	subject string
}

func (r onSubject) Subject() string { return r.subject }

func (r *fakeRequest) answers() []fakeReply {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fakeReply(nil), r.replies...)
}

// resendReq is a resend of a tag request with id, as the API handler receives it.
func resendReq(t *testing.T, id string) onSubject {
	t.Helper()
	b, err := codec.Marshal(&codec.Request{ID: id, Path: "/srv/a.png", Class: "batch", TimeoutMS: 30000})
	if err != nil {
		t.Fatal(err)
	}
	return onSubject{&fakeRequest{data: b, headers: micro.Headers{codec.HeaderResend: {"1"}}, reply: "_INBOX.resend." + id},
		subjects.APIPrefix + "." + subjects.OpTag}
}

// handleQuickly runs the API handler on r and fails t unless it returns within 200 ms.
func handleQuickly(t *testing.T, g *Gateway, r micro.Request) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.handle(subjects.OpTag, r, false)
	}()
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
		t.Fatal("the API handler is held by the answers bucket's read of a resend")
	}
}

// readsStarted waits, up to 5 s, until n reads of kv have begun.
func readsStarted(t *testing.T, kv *fakeKV, n int) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for i := range n {
		select {
		case <-kv.started:
		case <-timeout:
			t.Fatalf("%d of %d reads of the answers bucket started", i, n)
		}
	}
}

// readersDone waits until every resend reader of f has finished the reads it took, and
// those waiting before it: each reader takes one of resendReaders barriers (queued after
// the waiting reads), which hold until all of them are taken. A read answers its resend,
// or posts it to the loop as a new request, before it ends.
func readersDone(t *testing.T, f *failover) {
	t.Helper()
	var took sync.WaitGroup
	took.Add(resendReaders)
	release := make(chan struct{})
	defer close(release)
	for range resendReaders {
		f.reads <- func() { took.Done(); <-release }
	}
	all := make(chan struct{})
	go func() { took.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(5 * time.Second):
		t.Fatal("the resend readers did not finish their reads")
	}
}

// Rule 3 off the handler: a resend's read of the answers bucket never holds the API
// handler (a slow bucket would hold every request of the op); once read, the resend is
// answered exactly once: from the record, or run as a new request.
func TestResendReadOffHandler(t *testing.T) {
	g := unitGateway(t)
	f := g.failover
	kv := newFakeKV()
	f.kv = kv
	kept, _ := codec.Marshal(&codec.TagReply{General: map[string]float32{"blue": 0.99}})
	kv.get = func(key string) (jetstream.KeyValueEntry, error) {
		if key == answerKey(ownerOf("_INBOX.resend.answered"), "answered") {
			b, _ := codec.Marshal(&answerRecord{Gateway: "gone", Answered: true, Body: kept})
			return fakeEntry{value: b}, nil
		}
		return nil, jetstream.ErrKeyNotFound
	}

	answered, unknown := resendReq(t, "answered"), resendReq(t, "unknown")
	handleQuickly(t, g, answered)
	handleQuickly(t, g, unknown)
	readsStarted(t, kv, 2)
	if n := len(answered.answers()) + len(unknown.answers()); n != 0 {
		t.Fatalf("%d answers before the bucket answered", n)
	}
	close(kv.release)
	readersDone(t, f) // both reads done: answered or posted as new (and a second answer would have come)
	if !slices.Contains(unanswered(g), "unknown") {
		t.Fatal("the unknown resend was not queued as a new request")
	}
	if a := answered.answers(); len(a) != 1 || a[0].code != "" || string(a[0].body) != string(kept) {
		t.Fatalf("the answered resend's replies: %+v, want the kept answer once", a)
	}
	if a := unknown.answers(); len(a) != 0 {
		t.Fatalf("the resend run as new was answered before it ran: %+v", a)
	}
	// Run as new, it is held here: its next resend is answered with a notice at once.
	again := resendReq(t, "unknown")
	handleQuickly(t, g, again)
	if a := again.answers(); len(a) != 1 || len(a[0].body) != 0 {
		t.Fatalf("a resend of a request held here: %+v, want one notice", a)
	}
}

// The resends waiting for the answers bucket are bounded: past resendReaders reading and
// resendBacklog waiting, a resend is answered overloaded at once; each waiting one is
// still answered once the bucket answers.
func TestResendBacklogBounded(t *testing.T) {
	g := unitGateway(t)
	f := g.failover
	kv := newFakeKV()
	f.kv = kv
	kv.get = func(string) (jetstream.KeyValueEntry, error) {
		b, _ := codec.Marshal(&answerRecord{Gateway: "gone", Answered: true, Body: []byte{0xc0}})
		return fakeEntry{value: b}, nil
	}
	var reqs []onSubject
	send := func(n int) {
		for range n {
			r := resendReq(t, "q"+strconv.Itoa(len(reqs)))
			handleQuickly(t, g, r)
			reqs = append(reqs, r)
		}
	}
	// First as many as there are readers, each taken by one (the readers are goroutines
	// that may not have run yet: the backlog would fill first), then the backlog.
	send(resendReaders)
	readsStarted(t, kv, resendReaders)
	send(resendBacklog)
	over := resendReq(t, "over")
	handleQuickly(t, g, over)
	a := over.answers()
	var e codec.Error
	if len(a) != 1 || a[0].code != strconv.Itoa(codec.CodeOverloaded.Status()) || codec.Unmarshal(a[0].body, &e) != nil || e.Code != codec.CodeOverloaded {
		t.Fatalf("a resend past the backlog: %+v, want overloaded", a)
	}
	close(kv.release)
	readersDone(t, f) // every waiting read done, and a second answer would have come by now
	for _, r := range reqs {
		if a := r.answers(); len(a) != 1 {
			t.Fatalf("resend %s: %d answers, want 1", r.reply, len(a))
		}
	}
}
