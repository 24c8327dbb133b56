package worker

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/subjects"
)

// Models changed in place (inplace.go, modelSet), in process with fake models: the load
// and unload control verbs, a reload's swap, an unload under a running request, and the
// memory budget failing one model alone.

// copyModel is one copy of a raw model: a run can be held, and a close that comes while
// a run is running is recorded (sessions closed under a running ONNX Runtime call).
type copyModel struct {
	fakeRaw
	mu             sync.Mutex
	running, runs  int
	closedUnderRun bool
	once           sync.Once
	closedCh       chan struct{}
	hold           chan struct{} // when set, each run waits for a value
	started        chan struct{} // each run's start
}

func newCopy(name string) *copyModel {
	return &copyModel{fakeRaw: fakeRaw{name: name}, closedCh: make(chan struct{}), started: make(chan struct{}, 16)}
}

func (m *copyModel) Run(ctx context.Context, op string, items []models.Item) ([]codec.Replier, []error) {
	m.mu.Lock()
	m.running++
	m.runs++
	hold := m.hold
	m.mu.Unlock()
	m.started <- struct{}{}
	if hold != nil {
		<-hold
	}
	defer func() { m.mu.Lock(); m.running--; m.mu.Unlock() }()
	return m.fakeRaw.Run(ctx, op, items)
}

func (m *copyModel) Close() error {
	m.mu.Lock()
	if m.running > 0 {
		m.closedUnderRun = true
	}
	m.mu.Unlock()
	m.once.Do(func() { close(m.closedCh) })
	return nil
}

func (m *copyModel) isClosed() bool {
	select {
	case <-m.closedCh:
		return true
	default:
		return false
	}
}

func (m *copyModel) stats() (runs int, underRun bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.runs, m.closedUnderRun
}

// copies opens a new copyModel at each open, per model, and keeps them in order.
type copies struct {
	mu   sync.Mutex
	by   map[string][]*copyModel
	gate map[string]chan struct{} // an open of that model waits for a value
	fail map[string]error         // an open of that model fails so
	mem  map[string]config.Bytes  // declared memory, per model (its peak)
	// opening hears the name of each model an open starts for (after its state is set).
	opening chan string
}

func newCopies() *copies {
	return &copies{by: map[string][]*copyModel{}, gate: map[string]chan struct{}{}, fail: map[string]error{}, mem: map[string]config.Bytes{}, opening: make(chan string, 64)}
}

func (c *copies) open(_ models.Env, mc *config.Model) (models.Model, error) {
	c.mu.Lock()
	gate, fail := c.gate[mc.Name], c.fail[mc.Name]
	c.mu.Unlock()
	c.opening <- mc.Name
	if gate != nil {
		<-gate
	}
	if fail != nil {
		return nil, fail
	}
	m := newCopy(mc.Name)
	c.mu.Lock()
	c.by[mc.Name] = append(c.by[mc.Name], m)
	c.mu.Unlock()
	return m, nil
}

func (c *copies) get(name string, i int) *copyModel {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i >= len(c.by[name]) {
		return nil
	}
	return c.by[name][i]
}

// inplaceWorker is loadWorker with its models opened by cs (declared memory from cs.mem),
// loaded within budget, and slots running.
func inplaceWorker(t *testing.T, cs *copies, budget int64, slots int, names ...string) (*Worker, *nats.Conn) {
	t.Helper()
	w, nc := loadWorker(t, names...)
	for n, b := range cs.mem {
		if mc := w.cfg.Models[n]; mc != nil {
			mc.Memory = b
		}
	}
	w.ctl.key = testKey
	if err := loadWith(w, cs.open, budget); err != nil {
		t.Fatalf("loadModels: %v", err)
	}
	var wg sync.WaitGroup
	for range slots {
		wg.Add(1)
		go func() { defer wg.Done(); w.slots.slot() }()
	}
	t.Cleanup(func() { w.q.close(); wg.Wait() })
	return w, nc
}

// inbox collects the replies a test waits for.
type testInbox struct {
	t   *testing.T
	sub *nats.Subscription
	n   int
	nc  *nats.Conn
}

func newTestInbox(t *testing.T, nc *nats.Conn) *testInbox {
	sub, err := nc.SubscribeSync("_INBOX.ip.>")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return &testInbox{t: t, sub: sub, nc: nc}
}

// next is the next reply, its subject's last token and its error (nil for a result).
func (in *testInbox) next(what string) (string, *nats.Msg, *codec.Error) {
	in.t.Helper()
	m, err := in.sub.NextMsg(10 * time.Second)
	if err != nil {
		in.t.Fatalf("no reply for %s: %v", what, err)
	}
	return m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], m, reply.ErrorOf(m)
}

// item sends one infer item for model; its reply comes as key.
func (in *testInbox) item(w *Worker, model, key string) {
	b, _ := codec.Marshal(&codec.WorkItem{Request: codec.Request{ID: key, Model: model, Class: "interactive"}, Op: "infer"})
	w.serve.accept("interactive", &nats.Msg{Subject: "infer.cpu.interactive", Reply: "_INBOX.ip." + key, Data: b})
}

// testKey is the control key of the tests' workers, under which verb signs.
var testKey = []byte("0123456789abcdef0123456789abcdef")

// lastSent makes the tests' send times strictly increasing, as the gateway's are.
var lastSent atomic.Int64

// sentNow is the send time of the next signed body: now, or after the last one.
func sentNow() int64 {
	for {
		last := lastSent.Load()
		next := max(time.Now().UnixMilli(), last+1)
		if lastSent.CompareAndSwap(last, next) {
			return next
		}
	}
}

// verb sends a control verb with body (encoded as JSON when asJSON), a load or unload
// signed under testKey; its reply comes as key.
func (in *testInbox) verb(w *Worker, verb string, body any, asJSON bool, key string) {
	in.t.Helper()
	switch b := body.(type) {
	case *codec.WorkerLoad:
		b.Sign(testKey, w.id, sentNow())
	case *codec.WorkerUnload:
		b.Sign(testKey, w.id, sentNow())
	}
	in.send(w, verb, body, asJSON, key)
}

// send is verb without signing.
func (in *testInbox) send(w *Worker, verb string, body any, asJSON bool, key string) {
	in.t.Helper()
	b, err := codec.Encode(body, asJSON)
	if err != nil {
		in.t.Fatal(err)
	}
	if raw, ok := body.([]byte); ok {
		b = raw
	}
	m := nats.NewMsg("ortbus.worker." + w.id + "." + verb)
	m.Reply, m.Data = "_INBOX.ip."+key, b
	if asJSON {
		m.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	}
	w.ctl.handle(in.nc, verb, m)
}

// loadBody is a load of model name (kind raw, dir /srv/NAME, declared memory mem).
func loadBody(t *testing.T, name string, mem config.Bytes, budget int64, order ...string) *codec.WorkerLoad {
	t.Helper()
	b, err := config.MarshalModel(&config.Model{Name: name, Kind: config.KindRaw, Dir: "/srv/" + name, Memory: mem})
	if err != nil {
		t.Fatal(err)
	}
	return &codec.WorkerLoad{Model: name, Table: string(b), BudgetBytes: budget, Order: order}
}

// status is the model's status in the worker's heartbeat (ok false: not listed).
func status(w *Worker, name string) (codec.ModelStatus, bool) {
	for _, st := range w.snapshot().Models {
		if st.Name == name {
			return st, true
		}
	}
	return codec.ModelStatus{}, false
}

// TestModelOverBudgetFailsAlone: at start-up, a model whose peak would take the worker's
// models over its memory budget fails alone — state failed, code overloaded in its load
// error, its sessions closed — and the models before and after it serve; a request for it
// is answered model_unavailable with that error. Only a budget that leaves the worker no
// model at all fails the worker (overloaded).
func TestModelOverBudgetFailsAlone(t *testing.T) {
	cs := newCopies()
	cs.mem = map[string]config.Bytes{"a": 10 << 20, "big": 100 << 20, "c": 10 << 20}
	w, nc := inplaceWorker(t, cs, 50<<20, 1, "a", "big", "c")
	in := newTestInbox(t, nc)
	for name, want := range map[string]string{"a": codec.ModelReady, "big": codec.ModelFailed, "c": codec.ModelReady} {
		st, ok := status(w, name)
		if !ok || st.State != want {
			t.Errorf("%s: %+v, want %s", name, st, want)
		}
	}
	st, _ := status(w, "big")
	if st.Error == nil || st.Error.Code != codec.CodeOverloaded || !strings.Contains(st.Error.Message, "budget") || st.PeakBytes != 100<<20 {
		t.Errorf("big's status %+v, want failed overloaded with its peak", st)
	}
	if big := cs.get("big", 0); big == nil || !big.isClosed() {
		t.Error("the model over budget was not closed")
	}
	for _, name := range []string{"a", "c"} {
		in.item(w, name, "ok-"+name)
		if k, _, e := in.next(name); e != nil || k != "ok-"+name {
			t.Errorf("model %s: %s %+v, want served", name, k, e)
		}
	}
	in.item(w, "big", "big")
	if _, _, e := in.next("big"); e == nil || e.Code != codec.CodeModelUnavailable || e.Details["error"].(map[string]any)["code"] != string(codec.CodeOverloaded) {
		t.Errorf("a request for big: %+v, want model_unavailable with its overloaded load error", e)
	}

	// Nothing fits: the worker fails, overloaded (its pool's failure, as before).
	cs2 := newCopies()
	cs2.mem = map[string]config.Bytes{"huge": 100 << 20}
	w2, _ := loadWorker(t, "huge")
	w2.cfg.Models["huge"].Memory = 100 << 20
	if err := loadWith(w2, cs2.open, 50<<20); codec.CodeOf(err) != codec.CodeOverloaded || !strings.Contains(err.Error(), "device") {
		t.Errorf("a worker with no model under its budget: %v, want overloaded", err)
	}
}

// loadTurnFree fails t unless the worker's one load is free once the answer to the load
// of model came: the turn ends before the answer is sent (inplace.go, rule 2), so the
// test's next load, sent on that answer, is taken, not refused as "one load at a time".
func loadTurnFree(t *testing.T, w *Worker, model string) {
	t.Helper()
	w.ctl.mu.Lock()
	busy := w.ctl.loading
	w.ctl.mu.Unlock()
	if busy != "" {
		t.Fatalf("answered the load of %s while the worker's load of %s still held its turn", model, busy)
	}
}

// TestLoadInPlace: the load verb loads a new model in the background — loading in the
// heartbeat meanwhile, one load at a time, the worker's other model serving — and answers
// its ModelStatus once ready; it serves after. Malformed bodies are bad_request; a body
// in JSON works; a model whose peak passes the budget given fails alone (overloaded); a
// model that fails to load is failed and answered so. A body not signed by the worker's
// gateway (another key, another worker, too old, no signature) is refused, and a worker
// without a control key takes no verb.
func TestLoadInPlace(t *testing.T) {
	cs := newCopies()
	w, nc := inplaceWorker(t, cs, 0, 1, "a")
	in := newTestInbox(t, nc)
	gate := make(chan struct{})
	cs.gate["x"] = gate

	in.verb(w, subjects.VerbLoad, loadBody(t, "x", 0, 0, "x", "a"), false, "load-x")
	// The open of x waits: x is loading, a serves, a second load and an unload of x wait
	// their turn.
	for name := <-cs.opening; name != "x"; name = <-cs.opening {
	}
	if st, _ := status(w, "x"); st.State != codec.ModelLoading {
		t.Fatalf("x while it loads: %+v, want loading", st)
	}
	if st, _ := status(w, "a"); st.State != codec.ModelReady {
		t.Fatalf("a while x loads: %+v", st)
	}
	in.item(w, "a", "a1")
	if k, _, e := in.next("a while x loads"); k != "a1" || e != nil {
		t.Fatalf("a while x loads: %s %+v", k, e)
	}
	in.item(w, "x", "x0")
	if k, _, e := in.next("x while loading"); k != "x0" || e == nil || e.Code != codec.CodeUnknownModel {
		t.Fatalf("x while loading: %s %+v, want unknown_model", k, e)
	}
	in.verb(w, subjects.VerbLoad, loadBody(t, "y", 0, 0), false, "load-y")
	if k, _, e := in.next("a second load"); k != "load-y" || e == nil || e.Code != codec.CodeOverloaded {
		t.Fatalf("a second load while one runs: %s %+v, want overloaded", k, e)
	}
	in.verb(w, subjects.VerbUnload, &codec.WorkerUnload{Model: "x"}, false, "unload-x")
	if k, _, e := in.next("an unload of the model loading"); k != "unload-x" || e == nil || e.Code != codec.CodeOverloaded {
		t.Fatalf("an unload of x while it loads: %s %+v, want overloaded", k, e)
	}
	close(gate)
	k, m, e := in.next("load x")
	var st codec.ModelStatus
	if k != "load-x" || e != nil || codec.Unmarshal(m.Data, &st) != nil || st.Name != "x" || st.State != codec.ModelReady {
		t.Fatalf("load x: %s %+v %+v, want its ready status", k, e, st)
	}
	loadTurnFree(t, w, "x")
	if hb := w.snapshot(); len(hb.Models) != 2 || hb.Models[0].Name != "x" || hb.Models[1].Name != "a" {
		t.Errorf("heartbeat models %+v, want x then a (the order given)", hb.Models)
	}
	in.item(w, "x", "x1")
	if k, _, e := in.next("x"); k != "x1" || e != nil {
		t.Fatalf("x after its load: %s %+v", k, e)
	}
	if _, ok := w.q.caps["x"]; !ok {
		t.Error("x's batch cap not set")
	}

	// In JSON; over the budget given: fails alone, overloaded.
	in.verb(w, subjects.VerbLoad, loadBody(t, "big", 100<<20, 10<<20), true, "load-big")
	k, m, e = in.next("load big")
	if k != "load-big" || e == nil || e.Code != codec.CodeOverloaded || m.Header.Get(codec.HeaderContentType) != codec.ContentTypeJSON {
		t.Fatalf("load of a model over the budget: %s %+v, want overloaded in JSON", k, e)
	}
	loadTurnFree(t, w, "big")
	if st, _ := status(w, "big"); st.State != codec.ModelFailed || st.Error.Code != codec.CodeOverloaded {
		t.Errorf("big: %+v, want failed overloaded", st)
	}
	if big := cs.get("big", 0); big == nil || !big.isClosed() {
		t.Error("big, over the budget, not closed")
	}
	// A model that fails to load: failed, answered with its load error.
	cs.fail["bad"] = codec.Errorf(codec.CodeFileNotFound, "model bad: model.onnx not found")
	in.verb(w, subjects.VerbLoad, loadBody(t, "bad", 0, 0), false, "load-bad")
	if _, _, e := in.next("load bad"); e == nil || e.Code != codec.CodeFileNotFound || e.Details["error"].(map[string]any)["code"] != string(codec.CodeFileNotFound) {
		t.Errorf("load of a model that fails: %+v, want its file_not_found", e)
	}
	loadTurnFree(t, w, "bad")
	if st, _ := status(w, "bad"); st.State != codec.ModelFailed {
		t.Errorf("bad: %+v, want failed", st)
	}
	in.item(w, "a", "a2")
	if k, _, e := in.next("a"); k != "a2" || e != nil {
		t.Fatalf("a after the failed loads: %s %+v", k, e)
	}

	// Malformed bodies.
	for key, body := range map[string]any{
		"garbage":  []byte{0xc1, 0xff},
		"noname":   &codec.WorkerLoad{Table: "kind = \"raw\"\ndir = \"/srv/z\""},
		"badtable": &codec.WorkerLoad{Model: "z", Table: "kind = \"nope\"\ndir = \"/srv/z\""},
		"reldir":   &codec.WorkerLoad{Model: "z", Table: "kind = \"raw\"\ndir = \"z\""},
		"negative": &codec.WorkerLoad{Model: "z", Table: "kind = \"raw\"\ndir = \"/srv/z\"", BudgetBytes: -1},
	} {
		in.verb(w, subjects.VerbLoad, body, false, key)
		if k, _, e := in.next(key); k != key || e == nil || e.Code != codec.CodeBadRequest {
			t.Errorf("%s: %s %+v, want bad_request", key, k, e)
		}
	}
	// Not signed by the worker's gateway: refused, nothing loaded or unloaded.
	forged := loadBody(t, "z", 0, 0)
	forged.Sign([]byte("another key 0123456789abcdef0123"), w.id, sentNow())
	in.send(w, subjects.VerbLoad, forged, false, "forged")
	other := loadBody(t, "z", 0, 0)
	other.Sign(testKey, "another-worker", sentNow())
	in.send(w, subjects.VerbLoad, other, false, "other")
	old := &codec.WorkerUnload{Model: "a"}
	old.Sign(testKey, w.id, time.Now().Add(-2*codec.ControlSkew).UnixMilli())
	in.send(w, subjects.VerbUnload, old, false, "old")
	in.send(w, subjects.VerbUnload, &codec.WorkerUnload{Model: "a"}, false, "unsigned")
	for _, key := range []string{"forged", "other", "old", "unsigned"} {
		if k, _, e := in.next(key); e == nil || e.Code != codec.CodeBadRequest {
			t.Errorf("%s: %s %+v, want bad_request", key, k, e)
		}
	}
	// A body the worker took, heard on the bus and sent again: a replay.
	taken := &codec.WorkerUnload{Model: "nothing-such"}
	in.verb(w, subjects.VerbUnload, taken, false, "taken")
	if k, _, e := in.next("taken"); e == nil || e.Code != codec.CodeUnknownModel {
		t.Errorf("taken: %s %+v, want unknown_model (signed, so taken)", k, e)
	}
	in.send(w, subjects.VerbUnload, taken, false, "replayed")
	if k, _, e := in.next("replayed"); e == nil || e.Code != codec.CodeBadRequest || !strings.Contains(e.Message, "replay") {
		t.Errorf("replayed: %s %+v, want bad_request (a replay)", k, e)
	}
	if _, listed := status(w, "z"); listed {
		t.Error("z loaded by a load not signed by the gateway")
	}
	if st, _ := status(w, "a"); st.State != codec.ModelReady {
		t.Errorf("a after unsigned unloads: %+v, want ready", st)
	}
	w.ctl.key = nil
	in.verb(w, subjects.VerbUnload, &codec.WorkerUnload{Model: "a"}, false, "nokey")
	if _, _, e := in.next("unload on a worker without a key"); e == nil || e.Code != codec.CodeUnavailable {
		t.Errorf("a worker without a control key: %+v, want unavailable", e)
	}
	w.ctl.key = testKey

	in.verb(w, subjects.VerbUnload, &codec.WorkerUnload{Model: "nosuch"}, false, "unload-nosuch")
	if _, _, e := in.next("unload nosuch"); e == nil || e.Code != codec.CodeUnknownModel {
		t.Errorf("unload of a model the worker does not list: %+v, want unknown_model", e)
	}
	w.serve.draining.Store(true)
	in.verb(w, subjects.VerbLoad, loadBody(t, "z", 0, 0), false, "draining")
	if _, _, e := in.next("load while draining"); e == nil || e.Code != codec.CodeUnavailable {
		t.Errorf("load while draining: %+v, want unavailable", e)
	}
}

// TestReloadInPlace: a load of a model that serves is a reload: while a request runs on
// the old copy, the new copy loads and swaps in; requests accepted from then on run on the
// new copy, the running one finishes on the old and is answered, and only then is the old
// copy closed, never under its run. A new copy that fails leaves the old one serving, and
// the answer says why.
func TestReloadInPlace(t *testing.T) {
	cs := newCopies()
	w, nc := inplaceWorker(t, cs, 0, 2, "m")
	in := newTestInbox(t, nc)
	old := cs.get("m", 0)
	old.hold = make(chan struct{})
	in.item(w, "m", "running")
	<-old.started

	in.verb(w, subjects.VerbLoad, loadBody(t, "m", 0, 0), false, "reload")
	if k, _, e := in.next("reload"); k != "reload" || e != nil {
		t.Fatalf("reload: %s %+v", k, e)
	}
	fresh := cs.get("m", 1)
	if fresh == nil {
		t.Fatal("no new copy opened")
	}
	in.item(w, "m", "after")
	if k, _, e := in.next("a request after the swap"); k != "after" || e != nil {
		t.Fatalf("a request after the swap: %s %+v", k, e)
	}
	if runs, _ := fresh.stats(); runs != 1 {
		t.Errorf("the new copy ran %d requests, want 1", runs)
	}
	if old.isClosed() {
		t.Fatal("the old copy was closed while its request ran")
	}
	close(old.hold)
	if k, _, e := in.next("the request on the old copy"); k != "running" || e != nil {
		t.Fatalf("the request running on the old copy: %s %+v, want its result", k, e)
	}
	<-old.closedCh
	if _, under := old.stats(); under {
		t.Error("the old copy was closed under a running call")
	}
	if fresh.isClosed() {
		t.Error("the new copy closed")
	}

	// A new copy that fails: the old one serves on.
	cs.fail["m"] = codec.Errorf(codec.CodeModelUnavailable, "ONNX Runtime refused it")
	in.verb(w, subjects.VerbLoad, loadBody(t, "m", 0, 0), false, "reload-bad")
	if k, _, e := in.next("a failed reload"); k != "reload-bad" || e == nil || e.Code != codec.CodeModelUnavailable || !strings.Contains(e.Message, "serves on") || e.Details["error"] == nil {
		t.Fatalf("a reload whose new copy fails: %s %+v, want its error saying the old copy serves", k, e)
	}
	if st, _ := status(w, "m"); st.State != codec.ModelReady {
		t.Errorf("m after a failed reload: %+v, want ready", st)
	}
	in.item(w, "m", "still")
	if k, _, e := in.next("m after a failed reload"); k != "still" || e != nil {
		t.Fatalf("m after a failed reload: %s %+v", k, e)
	}
	if runs, _ := fresh.stats(); runs != 2 || fresh.isClosed() {
		t.Errorf("the copy in force ran %d requests (closed %v), want 2", runs, fresh.isClosed())
	}
}

// TestUnloadInPlace: an unload takes the model out at once — a request for it from then
// on is answered unknown_model, the worker's other model serving — while the request
// running on it finishes and is answered; its sessions close after that run, never under
// it, and only then is the unload answered (state unloaded); it leaves the heartbeat.
func TestUnloadInPlace(t *testing.T) {
	cs := newCopies()
	w, nc := inplaceWorker(t, cs, 0, 2, "a", "m")
	in := newTestInbox(t, nc)
	m := cs.get("m", 0)
	m.hold = make(chan struct{})
	in.item(w, "m", "running")
	<-m.started

	in.verb(w, subjects.VerbUnload, &codec.WorkerUnload{Model: "m"}, false, "unload")
	if _, listed := status(w, "m"); listed {
		t.Error("m still in the heartbeat after its unload")
	}
	in.item(w, "m", "late")
	if k, _, e := in.next("a request after the unload"); k != "late" || e == nil || e.Code != codec.CodeUnknownModel {
		t.Fatalf("a request after the unload: %s %+v, want unknown_model", k, e)
	}
	in.item(w, "a", "a")
	if k, _, e := in.next("a"); k != "a" || e != nil {
		t.Fatalf("a during m's unload: %s %+v", k, e)
	}
	if m.isClosed() {
		t.Fatal("m closed while its request ran")
	}
	close(m.hold)
	got := map[string]*codec.Error{}
	var st codec.ModelStatus
	for range 2 {
		k, msg, e := in.next("the running request and the unload")
		got[k] = e
		if k == "unload" && e == nil {
			if err := codec.Unmarshal(msg.Data, &st); err != nil {
				t.Fatal(err)
			}
		}
	}
	if e, ok := got["running"]; !ok || e != nil {
		t.Errorf("the request running at the unload: %+v, want its result", e)
	}
	if e, ok := got["unload"]; !ok || e != nil || st.Name != "m" || st.State != codec.ModelUnloaded {
		t.Errorf("the unload's answer: %+v %+v, want m unloaded", e, st)
	}
	if !m.isClosed() {
		t.Error("m not closed once unloaded")
	}
	if _, under := m.stats(); under {
		t.Error("m closed under a running call")
	}
	// Loaded again, it serves.
	in.verb(w, subjects.VerbLoad, loadBody(t, "m", 0, 0, "a", "m"), false, "load")
	if _, _, e := in.next("load m again"); e != nil {
		t.Fatalf("load m again: %+v", e)
	}
	in.item(w, "m", "again")
	if k, _, e := in.next("m loaded again"); k != "again" || e != nil {
		t.Fatalf("m loaded again: %s %+v", k, e)
	}
}
