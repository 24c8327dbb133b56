package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/ort"
)

// A model is the unit of failure (worker.go, loadModels): each model is loaded on its
// own, one that fails is failed with its reason, and the worker serves the others. In
// process, with fake models: no runtime.

// fakeRaw is a raw (infer) model whose warm-up does what it is told; it answers every
// item with an empty InferReply.
type fakeRaw struct {
	name   string
	warmup func() error
	closed bool
}

func (m *fakeRaw) Name() string             { return m.name }
func (m *fakeRaw) Kind() string             { return config.KindRaw }
func (m *fakeRaw) Ops() []string            { return []string{"infer"} }
func (m *fakeRaw) Batchable(string) bool    { return false }
func (m *fakeRaw) MaxBatch() int            { return 1 }
func (m *fakeRaw) Sessions() []*ort.Session { return nil }
func (m *fakeRaw) Close() error             { m.closed = true; return nil }
func (m *fakeRaw) Warmup(context.Context, int) error {
	if m.warmup == nil {
		return nil
	}
	return m.warmup()
}
func (m *fakeRaw) Prepare(string, *codec.WorkItem) (models.Item, error) { return nil, nil }
func (m *fakeRaw) Run(_ context.Context, _ string, items []models.Item) ([]codec.Replier, []error) {
	out := make([]codec.Replier, len(items))
	for i := range out {
		out[i] = &codec.InferReply{}
	}
	return out, make([]error, len(items))
}

// loadWorker is a worker in process (no runtime, no slots) of a pool "cpu" with the raw
// models names, on an in-process NATS server.
func loadWorker(t *testing.T, names ...string) (*Worker, *nats.Conn) {
	t.Helper()
	src := "[nats]\nurl = \"nats://127.0.0.1:1\"\n[security]\nallowed_roots = [\"/srv\"]\n[pools.cpu]\nclasses = [\"interactive\"]\nmodels = [\"" + strings.Join(names, "\", \"") + "\"]\n"
	for _, n := range names {
		src += "[models." + n + "]\nkind = \"raw\"\ndir = \"/srv/" + n + "\"\n"
	}
	c, err := config.Parse([]byte(src), "load.toml")
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.InProcessNATS(t)
	p := c.Pools["cpu"]
	w := testWorker(c, p.Name, "cpu-load", nc)
	return w, nc
}

// testWorker is a worker of pool of c, wired as New wires one, without a runtime (a fake
// one, version "unit") or models, its answers going out on nc.
func testWorker(c *config.Config, pool, id string, nc *nats.Conn) *Worker {
	w := wire(c, c.Pools[pool], id, slog.New(slog.NewTextHandler(io.Discard, nil)), &ort.Runtime{Version: "unit"}, models.Env{})
	w.reply.connect(nc)
	return w
}

// ask sends one infer item to w (model name, "" for the pool's choice) and returns the
// error it was answered at once, or nil if it was queued.
func ask(t *testing.T, w *Worker, nc *nats.Conn, model string) *codec.Error {
	t.Helper()
	sub, err := nc.SubscribeSync("_INBOX.load.>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	b, _ := codec.Marshal(&codec.WorkItem{Request: codec.Request{ID: "r-" + model, Model: model, Class: "interactive"}, Op: "infer"})
	w.serve.accept("interactive", &nats.Msg{Subject: "infer.cpu.interactive", Reply: "_INBOX.load.1", Data: b})
	if _, _, held := w.q.counts(); len(held) == 1 {
		j, _ := w.q.cancel(held[0])
		j.answered.Store(true)
		j.cancel()
		return nil
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no answer for model %q: %v", model, err)
	}
	e := reply.ErrorOf(m)
	if e == nil {
		t.Fatalf("model %q: answered %q at once, want an error or the item queued", model, m.Data)
	}
	return e
}

// TestModelUnitOfFailure: of four models, one whose open fails (the runtime refuses it),
// one whose open panics, and one whose warm-up panics are failed, each with its reason,
// their sessions closed; one whose warm-up returns an error serves all the same (synthetic
// zeros are not every model's input). The worker serves the good ones, answers
// model_unavailable with the load error in details.error for the failed ones, and its
// heartbeat shows each model's state.
func TestModelUnitOfFailure(t *testing.T) {
	w, nc := loadWorker(t, "refused", "good", "opanic", "wpanic", "wfails")
	built := map[string]*fakeRaw{}
	open := func(_ models.Env, mc *config.Model) (models.Model, error) {
		m := &fakeRaw{name: mc.Name}
		built[mc.Name] = m
		switch mc.Name {
		case "refused":
			return nil, codec.Errorf(codec.CodeModelUnavailable, "ONNX Runtime cannot load /srv/refused/model.onnx: No Op registered for NoSuchOp").With("path", "/srv/refused/model.onnx").With("model", "refused")
		case "opanic":
			var nilMap map[string]int
			nilMap["x"]++ // a Go panic while opening
		case "wpanic":
			m.warmup = func() error { panic("a nil tensor destroyed") }
		case "wfails":
			m.warmup = func() error { return errors.New("Invalid input shape: {96}") }
		}
		return m, nil
	}
	panics := guard.Panics()
	if err := loadWith(w, open, 0); err != nil {
		t.Fatalf("loadModels: %v", err)
	}
	if got := guard.Panics() - panics; got != 2 {
		t.Errorf("%d panics counted, want 2 (open and warm-up)", got)
	}
	if !built["wpanic"].closed {
		t.Error("the model whose warm-up panicked was not closed")
	}
	want := map[string]struct {
		state string
		code  codec.Code
		text  string
	}{
		"refused": {codec.ModelFailed, codec.CodeModelUnavailable, "NoSuchOp"},
		"good":    {codec.ModelReady, "", ""},
		"opanic":  {codec.ModelFailed, codec.CodeInternal, "panic while loading model opanic: assignment to entry in nil map"},
		"wpanic":  {codec.ModelFailed, codec.CodeInternal, "panic while loading model wpanic: a nil tensor destroyed"},
		"wfails":  {codec.ModelReady, "", ""},
	}
	hb := w.snapshot()
	if len(hb.Models) != len(want) {
		t.Fatalf("heartbeat models %+v, want %d", hb.Models, len(want))
	}
	for i, st := range hb.Models {
		if st.Name != w.pool.Models[i] {
			t.Errorf("heartbeat model %d is %s, want %s (pool order)", i, st.Name, w.pool.Models[i])
		}
		x := want[st.Name]
		if st.State != x.state || st.Loaded != (x.state == codec.ModelReady) || st.Kind != config.KindRaw {
			t.Errorf("%s: state %q loaded %v kind %q, want %q", st.Name, st.State, st.Loaded, st.Kind, x.state)
		}
		switch {
		case x.code == "" && st.Error != nil:
			t.Errorf("%s: error %+v, want none", st.Name, st.Error)
		case x.code != "" && (st.Error == nil || st.Error.Code != x.code || !strings.Contains(st.Error.Message, x.text)):
			t.Errorf("%s: error %+v, want %s with %q", st.Name, st.Error, x.code, x.text)
		}
	}
	if ws := hb.Models[4].WarmupError; !strings.Contains(ws, "Invalid input shape") {
		t.Errorf("wfails: warmup_error %q, want the warm-up's error", ws)
	}
	if d := hb.Models[0].Error.Details; d["path"] != "/srv/refused/model.onnx" || d["model"] != "refused" {
		t.Errorf("refused: error details %v, want its path and model", d)
	}

	// Requests: the good models run (queued), the failed ones are answered at once.
	for _, name := range []string{"good", "wfails", ""} {
		if e := ask(t, w, nc, name); e != nil {
			t.Errorf("model %q: %+v, want it queued", name, e)
		}
	}
	for name, text := range map[string]string{"refused": "NoSuchOp", "wpanic": "a nil tensor destroyed"} {
		e := ask(t, w, nc, name)
		if e.Code != codec.CodeModelUnavailable || e.Code.Status() != 503 || !strings.Contains(e.Message, text) {
			t.Errorf("model %s: %+v, want model_unavailable (503) with %q", name, e, text)
			continue
		}
		le, _ := e.Details["error"].(map[string]any)
		if e.Details["model"] != name || e.Details["pool"] != "cpu" || e.Details["worker"] != "cpu-load" || le == nil || !strings.Contains(le["message"].(string), text) {
			t.Errorf("model %s: details %v, want model, pool, worker and the load error", name, e.Details)
		}
	}
	if e := ask(t, w, nc, "nosuch"); e.Code != codec.CodeUnknownModel {
		t.Errorf("a model the pool does not have: %+v, want unknown_model", e)
	}
}

// TestEveryModelFailed: a worker whose every model failed still loads (it serves
// model_unavailable); a request naming no model gets the first failed model's error.
func TestEveryModelFailed(t *testing.T) {
	w, nc := loadWorker(t, "a", "b")
	open := func(_ models.Env, mc *config.Model) (models.Model, error) {
		return nil, codec.Errorf(codec.CodeFileNotFound, "model %s: model.onnx not found", mc.Name)
	}
	if err := loadWith(w, open, 0); err != nil {
		t.Fatalf("loadModels: %v", err)
	}
	if order, failed := w.models.names(); len(order) != 2 || len(failed) != 2 {
		t.Fatalf("models %v, failed %v", order, failed)
	}
	e := ask(t, w, nc, "")
	le, _ := e.Details["error"].(map[string]any)
	if e.Code != codec.CodeModelUnavailable || e.Details["model"] != "a" || le == nil || le["code"] != string(codec.CodeFileNotFound) {
		t.Errorf("a request for any model: %+v, want model_unavailable for a with its file_not_found", e)
	}
}

// TestFailedStatusBounded: a load error's message (the runtime's text can be long) and
// details are bounded in the heartbeat, cut at a character boundary.
func TestFailedStatusBounded(t *testing.T) {
	long := strings.Repeat("é", maxLoadError) // two bytes each
	st := failedStatus(&config.Model{Name: "m", Kind: config.KindRaw}, codec.Errorf(codec.CodeModelUnavailable, "%s", long).
		With("path", "/srv/m.onnx").With("ep", strings.Repeat("x", maxLoadDetail+1)).With("tried", []string{"a", "b"}))
	if st.State != codec.ModelFailed || st.Loaded || len(st.Error.Message) > maxLoadError+len("…") || !strings.HasSuffix(st.Error.Message, "é…") {
		t.Errorf("status %q, message of %d bytes ending %q", st.State, len(st.Error.Message), st.Error.Message[len(st.Error.Message)-8:])
	}
	if len(st.Error.Details) != 1 || st.Error.Details["path"] != "/srv/m.onnx" {
		t.Errorf("details %v, want path alone", st.Error.Details)
	}
}

// loadWith loads w's pool's models opened by open, within budget (0: none).
func loadWith(w *Worker, open opener, budget int64) error {
	w.loader.open = open
	return w.loader.loadAll(budget)
}
