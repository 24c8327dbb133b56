package worker

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/subjects"
)

// Models changed in place: the control verbs load and unload
// (ortbus.worker.<worker>.load|unload), sent by the gateway that supervises the worker
// (gateway/reload.go), change the worker's models without a restart. The rules:
//
//  1. The bodies are codec messages (WorkerLoad, WorkerUnload; JSON with the JSON
//     content-type), decoded and validated as any input, a load's table as the config
//     validates a [models.NAME] table (config.ParseModel); a malformed one is answered
//     bad_request. Their reply subjects are checked as every message's (checked). Each
//     must be signed by the gateway that started the worker (codec.WorkerLoad.Sign: the
//     worker's control key, codec.WorkerKey), and sent after the last one the worker
//     took (a replay is refused): another is answered bad_request, and a worker without
//     a key answers unavailable.
//  2. One load at a time: a load while another runs, or an unload of the model being
//     loaded, is answered overloaded. A load's turn ends before its answer is sent, so a
//     load or unload sent once the answer came is taken. A draining worker answers
//     unavailable.
//  3. A load runs in the background. The model is loading in the heartbeat (unless a
//     copy of it serves), then ready, or failed with its reason. A model whose peak
//     passes budget_bytes fails alone (overloaded), as at start-up. The answer is the
//     model's ModelStatus, or an error of its load error's code (overloaded,
//     model_unavailable, file_not_found, ...), the load error in details.error.
//  4. A load of a model that serves is a reload: the new copy loads beside the old one
//     and swaps in (modelSet, rule 2): no gap. If it fails, the old copy keeps serving
//     and the answer says why.
//  5. An unload takes the model out of the set at once (a request for it is answered
//     unknown_model from then on); its accepted requests run and are answered, then its
//     sessions close (modelSet, rule 3), and the answer is its status, state unloaded.
//     A model the worker does not list is answered unknown_model.

// controlBody is a load or unload body (codec.WorkerLoad, codec.WorkerUnload).
type controlBody interface {
	Validate() error
	Verify(key []byte, worker string, now time.Time) error
	Sent() int64
}

// decodeControl decodes m's body into req, validates it and checks that the gateway
// holding this worker's control key signed it for this worker, lately, after the last
// one taken (rule 1).
func (w *Worker) decodeControl(m *nats.Msg, asJSON bool, req controlBody) error {
	if err := codec.Decode(m.Data, req, asJSON); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	if err := req.Verify(w.controlKey, w.id, time.Now()); err != nil {
		return err
	}
	for {
		last := w.lastControl.Load()
		if req.Sent() <= last {
			return codec.Errorf(codec.CodeBadRequest, "sent_unix_ms %d is not after the last control message taken (%d): a replay", req.Sent(), last).With("field", "sent_unix_ms")
		}
		if w.lastControl.CompareAndSwap(last, req.Sent()) {
			return nil
		}
	}
}

// inplace is the state of the worker's load in place (rule 2).
type inplace struct {
	mu      sync.Mutex
	loading string // the model being loaded; "" when none
}

// controlModels handles a load or unload control message (verb), on its subscription's
// goroutine: it never waits for a load or for an unloaded model's requests.
func (w *Worker) controlModels(nc *nats.Conn, verb string, m *nats.Msg) {
	asJSON := m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON
	respond := func(st *codec.ModelStatus, err error) {
		if m.Reply == "" {
			return
		}
		var out *nats.Msg
		if err != nil {
			out = reply.Error(m.Reply, codec.AsError(err), asJSON)
		} else {
			b, encErr := codec.Encode(st, asJSON)
			if encErr != nil {
				out = reply.Error(m.Reply, codec.Errorf(codec.CodeInternal, "encode model status: %v", encErr), asJSON)
			} else {
				out = reply.Result(m.Reply, b, asJSON)
			}
		}
		if perr := nc.PublishMsg(out); perr != nil {
			w.publishFailed(verb, "", perr)
		}
	}
	if w.draining.Load() {
		respond(nil, codec.Errorf(codec.CodeUnavailable, "worker %s is draining: it changes no model", w.id).With("worker", w.id))
		return
	}
	switch verb {
	case subjects.VerbLoad:
		var req codec.WorkerLoad
		if err := w.decodeControl(m, asJSON, &req); err != nil {
			respond(nil, err)
			return
		}
		mc, err := config.ParseModel(req.Model, []byte(req.Table))
		if err != nil {
			respond(nil, codec.Errorf(codec.CodeBadRequest, "%v", err).With("field", "table"))
			return
		}
		if _, listed := w.models.state(mc.Name); !listed && w.models.len() >= codec.MaxHeartbeatList {
			respond(nil, codec.Errorf(codec.CodeBadRequest, "worker %s loads %d models already, the most a heartbeat lists", w.id, codec.MaxHeartbeatList))
			return
		}
		if busy := w.beginLoad(mc.Name); busy != "" {
			respond(nil, codec.Errorf(codec.CodeOverloaded, "worker %s is loading model %s; one load at a time", w.id, busy).With("worker", w.id).With("model", busy))
			return
		}
		go func() {
			// The load ends (its turn given back) before its answer is sent: a load sent
			// after the answer is never refused for this one (rule 2).
			st, err := func() (st codec.ModelStatus, err error) {
				defer w.endLoad()
				defer guard.Recover(w.log, "loading model "+mc.Name+" in place", func(e *codec.Error) { st, err = codec.ModelStatus{}, e })
				return w.loadInPlace(mc, req.BudgetBytes, req.Order)
			}()
			respond(&st, err)
		}()
	case subjects.VerbUnload:
		var req codec.WorkerUnload
		if err := w.decodeControl(m, asJSON, &req); err != nil {
			respond(nil, err)
			return
		}
		// Checked and removed under the load's lock: a load of the model cannot begin
		// between the two (rule 2).
		w.inplace.mu.Lock()
		loading := w.inplace.loading == req.Model
		var st codec.ModelStatus
		var old *loaded
		var found bool
		if !loading {
			st, _ = w.models.state(req.Model)
			old, found = w.models.remove(req.Model)
		}
		w.inplace.mu.Unlock()
		if loading {
			respond(nil, codec.Errorf(codec.CodeOverloaded, "worker %s is loading model %s: unload it once the load is done", w.id, req.Model).With("worker", w.id).With("model", req.Model))
			return
		}
		if !found {
			respond(nil, codec.Errorf(codec.CodeUnknownModel, "worker %s does not load model %s", w.id, req.Model).With("worker", w.id).With("model", req.Model))
			return
		}
		w.log.Info("model unloaded; its sessions close once its requests are answered", "model", req.Model)
		st.State, st.Loaded, st.Error = codec.ModelUnloaded, false, nil
		if old == nil {
			respond(&st, nil)
			return
		}
		go func() {
			<-old.closed
			respond(&st, nil)
		}()
	}
}

// beginLoad takes the worker's one load for model, or returns the model whose load runs.
func (w *Worker) beginLoad(model string) (busy string) {
	w.inplace.mu.Lock()
	defer w.inplace.mu.Unlock()
	if w.inplace.loading != "" {
		return w.inplace.loading
	}
	w.inplace.loading = model
	return ""
}

func (w *Worker) endLoad() {
	w.inplace.mu.Lock()
	w.inplace.loading = ""
	w.inplace.mu.Unlock()
}

// loadInPlace loads mc (rules 3 and 4), placed per order (the pool's models in force),
// within budget bytes (0: no limit), and returns its status, or the error it failed with.
func (w *Worker) loadInPlace(mc *config.Model, budget int64, order []string) (codec.ModelStatus, error) {
	serving := w.models.loading(mc.Name, mc.Kind, order)
	w.log.Info("loading a model in place", "model", mc.Name, "reload", serving, "budget", mib(budget))
	// What the process holds now is not the model's: its peak is measured from here.
	w.rssBase = resetPeak()
	m, st := w.loadModel(w.env, w.open, mc, budget, budget > 0)
	if m != nil && budget > 0 && st.PeakBytes > budget {
		closeQuietly(m)
		m, st = nil, w.overBudget(mc, st, st.PeakBytes, budget)
	}
	if m == nil {
		w.rssBase = hwmBytes()
		what := "failed to load"
		if serving {
			what = "failed to load again (its new copy); the copy loaded before serves on"
		} else {
			w.models.fail(st, order)
		}
		w.log.Error("model "+what, "model", mc.Name, "code", st.Error.Code, "err", st.Error.Message)
		return st, codec.Errorf(st.Error.Code, "model %s %s on worker %s: %s", mc.Name, what, w.id, st.Error.Message).
			With("model", mc.Name).With("worker", w.id).With("pool", w.pool.Name).With("error", st.Error)
	}
	w.q.setCap(mc.Name, st.MaxBatch)
	if old := w.models.serve(m, st, order); old != nil {
		w.log.Info("model reloaded; its old copy closes once its requests are answered", "model", mc.Name, "load_ms", st.LoadMS)
	} else {
		w.log.Info("model loaded in place", "model", mc.Name, "load_ms", st.LoadMS, "peak", mib(st.PeakBytes))
	}
	return st, nil
}
