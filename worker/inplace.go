package worker

import (
	"log/slog"
	"sync"
	"sync/atomic"
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
// (gateway/reload.go), change the worker's models without a restart: the controller takes
// them (the serving side hands it their messages) and has the loader load (loader.go) or
// the model set drop (modelset.go) the model. The rules:
//
//  1. The bodies are codec messages (WorkerLoad, WorkerUnload; JSON with the JSON
//     content-type), decoded and validated as any input, a load's table as the config
//     validates a [models.NAME] table (config.ParseModel); a malformed one is answered
//     bad_request. Their reply subjects are checked as every message's (server.checked).
//     Each must be signed by the gateway that started the worker (codec.WorkerLoad.Sign: the
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

// controller takes the load and unload control verbs (the rules above). It owns the key
// they are checked with, the last one taken (rule 1) and the one load at a time (rule 2).
type controller struct {
	worker, pool string
	log          *slog.Logger
	loader       *loader
	models       *modelSet
	reply        *replier     // counts what cannot be sent
	draining     *atomic.Bool // the serving side's: a draining worker changes no model
	// key checks the verbs' signatures (config.ControlKeyEnv: the gateway that started
	// the worker signs them); without it the worker takes neither.
	key []byte
	// last is the send time of the last load or unload taken: a body sent no later is a
	// replay (rule 1).
	last atomic.Int64

	mu      sync.Mutex
	loading string // the model being loaded; "" when none (rule 2)
}

func newController(worker, pool string, log *slog.Logger, l *loader, ms *modelSet, r *replier, draining *atomic.Bool) *controller {
	return &controller{worker: worker, pool: pool, log: log, loader: l, models: ms, reply: r, draining: draining}
}

// verify decodes m's body into req, validates it and checks that the gateway holding
// this worker's control key signed it for this worker, lately, after the last one taken
// (rule 1).
func (c *controller) verify(m *nats.Msg, asJSON bool, req controlBody) error {
	if err := codec.Decode(m.Data, req, asJSON); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	if err := req.Verify(c.key, c.worker, time.Now()); err != nil {
		return err
	}
	for {
		last := c.last.Load()
		if req.Sent() <= last {
			return codec.Errorf(codec.CodeBadRequest, "sent_unix_ms %d is not after the last control message taken (%d): a replay", req.Sent(), last).With("field", "sent_unix_ms")
		}
		if c.last.CompareAndSwap(last, req.Sent()) {
			return nil
		}
	}
}

// responder answers a control message m on nc: a model's status, or an error.
func (c *controller) responder(nc *nats.Conn, verb string, m *nats.Msg, asJSON bool) func(*codec.ModelStatus, error) {
	return func(st *codec.ModelStatus, err error) {
		if m.Reply == "" {
			return
		}
		var out *nats.Msg
		if err != nil {
			out = reply.Error(m.Reply, codec.AsError(err), asJSON)
		} else if b, encErr := codec.Encode(st, asJSON); encErr != nil {
			out = reply.Error(m.Reply, codec.Errorf(codec.CodeInternal, "encode model status: %v", encErr), asJSON)
		} else {
			out = reply.Result(m.Reply, b, asJSON)
		}
		if perr := nc.PublishMsg(out); perr != nil {
			c.reply.publishFailed(verb, "", perr)
		}
	}
}

// handle takes a load or unload control message (verb), on its subscription's goroutine:
// it never waits for a load or for an unloaded model's requests.
func (c *controller) handle(nc *nats.Conn, verb string, m *nats.Msg) {
	asJSON := m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON
	respond := c.responder(nc, verb, m, asJSON)
	if c.draining.Load() {
		respond(nil, codec.Errorf(codec.CodeUnavailable, "worker %s is draining: it changes no model", c.worker).With("worker", c.worker))
		return
	}
	switch verb {
	case subjects.VerbLoad:
		var req codec.WorkerLoad
		if err := c.verify(m, asJSON, &req); err != nil {
			respond(nil, err)
			return
		}
		c.load(req, respond)
	case subjects.VerbUnload:
		var req codec.WorkerUnload
		if err := c.verify(m, asJSON, &req); err != nil {
			respond(nil, err)
			return
		}
		c.unload(req.Model, respond)
	}
}

// load loads the model of a load body in the background (rules 2 to 4).
func (c *controller) load(req codec.WorkerLoad, respond func(*codec.ModelStatus, error)) {
	mc, err := config.ParseModel(req.Model, []byte(req.Table))
	if err != nil {
		respond(nil, codec.Errorf(codec.CodeBadRequest, "%v", err).With("field", "table"))
		return
	}
	if _, listed := c.models.state(mc.Name); !listed && c.models.len() >= codec.MaxHeartbeatList {
		respond(nil, codec.Errorf(codec.CodeBadRequest, "worker %s loads %d models already, the most a heartbeat lists", c.worker, codec.MaxHeartbeatList))
		return
	}
	if busy := c.begin(mc.Name); busy != "" {
		respond(nil, codec.Errorf(codec.CodeOverloaded, "worker %s is loading model %s; one load at a time", c.worker, busy).With("worker", c.worker).With("model", busy))
		return
	}
	go func() {
		// The load ends (its turn given back) before its answer is sent: a load sent
		// after the answer is never refused for this one (rule 2).
		st, err := func() (st codec.ModelStatus, err error) {
			defer c.end()
			defer guard.Recover(c.log, "loading model "+mc.Name+" in place", func(e *codec.Error) { st, err = codec.ModelStatus{}, e })
			return c.loader.reload(mc, req.BudgetBytes, req.Order)
		}()
		respond(&st, err)
	}()
}

// unload takes model out of the set (rule 5), and answers once its sessions closed.
func (c *controller) unload(model string, respond func(*codec.ModelStatus, error)) {
	// Checked and removed under the load's lock: a load of the model cannot begin
	// between the two (rule 2).
	c.mu.Lock()
	loading := c.loading == model
	var st codec.ModelStatus
	var old *loaded
	var found bool
	if !loading {
		st, _ = c.models.state(model)
		old, found = c.models.remove(model)
	}
	c.mu.Unlock()
	if loading {
		respond(nil, codec.Errorf(codec.CodeOverloaded, "worker %s is loading model %s: unload it once the load is done", c.worker, model).With("worker", c.worker).With("model", model))
		return
	}
	if !found {
		respond(nil, codec.Errorf(codec.CodeUnknownModel, "worker %s does not load model %s", c.worker, model).With("worker", c.worker).With("model", model))
		return
	}
	c.log.Info("model unloaded; its sessions close once its requests are answered", "model", model)
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

// begin takes the worker's one load for model, or returns the model whose load runs.
func (c *controller) begin(model string) (busy string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loading != "" {
		return c.loading
	}
	c.loading = model
	return ""
}

func (c *controller) end() {
	c.mu.Lock()
	c.loading = ""
	c.mu.Unlock()
}
