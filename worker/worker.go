// Package worker is one resident ortbus worker: one ONNX Runtime library, one execution
// provider, the pool's models loaded once, serving infer.<pool>.<class> from the pool's
// queue group. It schedules its own slots by class priority, answers every work item
// exactly once, publishes heartbeats, honours cancels, and drains on shutdown.
//
// The worker is components, each owning its state (its own lock or goroutine), which
// Worker only wires (wire) and runs (ServeConn):
//
//	modelSet   (modelset.go)  the models: their states, the copies jobs hold, lookup
//	loader     (loader.go)    loads (start-up, in place) with their peaks (peaks.go)
//	controller (inplace.go)   the load and unload control verbs
//	devMem     (devmem.go)    the sampler of the process's memory on its device
//	server     (serve.go)     subscriptions, acceptance, cancels, control verbs
//	queues     (queue.go)     the local per-class queues
//	slots      (slots.go)     the slots that run the queued work
//	decoder    (decode.go)    the decode stage: a request's inputs into tensors, ahead
//	                          of the slots on threads of its own
//	replier    (answer.go)    each job's one answer, and claims
//
// A request's way: server.accept → modelSet.acquire → queues.put; a slot's
// queues.take → decoder.claim (decoded ahead since queues.put) → the model's Run →
// replier.answer.
package worker

import (
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/images/vips"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/ort"
	"github.com/ortbus/ortbus/subjects"
)

// Options configure a worker.
type Options struct {
	Config *config.Config
	Pool   string
	// ID is the worker id (a subject token); default: <pool>-<random>.
	ID     string
	Logger *slog.Logger
	// OnReady is called once the worker is subscribed and serving.
	OnReady func(*Worker)
	// OnLoading, if set, is called with each model's name before the worker loads it
	// (ortworker prints the "loading" event line its supervisor reads).
	OnLoading func(model string)
}

// Worker is a loaded worker, ready to serve: its components, wired.
type Worker struct {
	cfg   *config.Config
	pool  *config.Pool
	id    string
	host  string
	log   *slog.Logger
	rt    *ort.Runtime
	start time.Time
	ready func(*Worker) // Options.OnReady
	// adapter is the Vulkan adapter of a webgpu worker, and its mismatch with the
	// pool's device when the pool serves on it flagged (adapter.go).
	adapter adapterCheck

	models *modelSet
	loader *loader
	ctl    *controller
	dev    *devMem
	serve  *server
	q      *queues
	slots  *slots
	reply  *replier
}

// wire builds the components of a worker of pool p (of config c) on runtime rt, its
// models to be loaded through env, and ties each to the ones it uses.
func wire(c *config.Config, p *config.Pool, id string, log *slog.Logger, rt *ort.Runtime, env models.Env) *Worker {
	w := &Worker{cfg: c, pool: p, id: id, log: log, rt: rt, start: time.Now()}
	w.host, _ = os.Hostname()
	w.models = newModelSet(p.Name, id)
	w.dev = newDevMem(p.Device)
	w.q = newQueues(c.ClassNames(), p.QueueBound, p.MaxBatch, p.MaxDelay.D())
	w.loader = newLoader(c, p, id, log, env, w.models, w.q, w.dev)
	w.reply = newReplier(codec.Served{Pool: p.Name, Worker: id, Runtime: rt.Version}, codec.Claim{Worker: id, Pool: p.Name}, log, w.models)
	dec := newDecoder(log, w.q.upcoming, p.DecodeWorkers(runtime.NumCPU()), p.Slots*max(1, p.MaxBatch))
	w.q.changed = dec.wake
	w.slots = newSlots(p.Slots, w.q, dec, w.reply, log)
	w.slots.watch = &adapterWatch{models: w.models, adapter: func() string { return w.adapter.adapter }, log: log}
	w.serve = &server{cfg: c, pool: p, worker: id, log: log, models: w.models, q: w.q, reply: w.reply, snapshot: w.snapshot, replies: c.NATS.Replies()}
	w.ctl = newController(id, p.Name, log, w.loader, w.models, w.reply, &w.serve.draining)
	w.serve.ctl = w.ctl
	return w
}

// New finds and loads the pool's runtime and opens its models. A runtime
// that cannot be found or loaded is a runtime_missing *codec.Error naming every searched
// path; an EP chain none of which can be used is provider_unavailable; models over the
// memory budget are overloaded: those fail the pool, and New returns them.
//
// A model is the unit of failure, not the pool (loader.go): a worker whose every model
// failed still starts, and answers model_unavailable.
func New(opts Options) (*Worker, error) {
	c := opts.Config
	p, ok := c.Pools[opts.Pool]
	if !ok {
		return nil, codec.Errorf(codec.CodeUnknownPool, "pool %q is not in the config", opts.Pool)
	}
	p, err := poolModels(c, p)
	if err != nil {
		return nil, err
	}
	id, log := opts.ID, opts.Logger
	if id == "" {
		id = p.Name + "-" + nuid.Next()[16:]
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	log = log.With("worker", id, "pool", p.Name)
	rt, err := ort.LoadSpec(ort.PoolSpec(p))
	if err != nil {
		if e := codec.AsError(err); e.Code == codec.CodeRuntimeMissing {
			e.With("pool", p.Name)
		}
		return nil, err
	}
	sc := ort.PoolSessionConfig(p, c.Spins(p.Name, runtime.NumCPU()))
	// Every session records where its warm-up's nodes run (nodes_by_ep, and cpu_fallback
	// = false's check: checkPlacement), its profiler off once the load has read it.
	sc.Placement = true
	// An EP chain none of which the runtime can use at all (its provider library is
	// missing) fails every model alike: that is the pool's failure, as a missing runtime
	// is, and the worker does not start. An EP that refuses one model fails that model.
	if err := rt.ProbeChain(sc); err != nil {
		return nil, codec.AsError(err).With("pool", p.Name)
	}
	// A webgpu pool's adapter is the GPU its device names, or the pool says it serves on
	// another, flagged: never silently.
	adapter, err := checkAdapter(p, sc, rt.ProbeProvider, log)
	if err != nil {
		return nil, err
	}
	env := models.Env{
		Runtime:  rt,
		Session:  sc,
		Images:   images.Policy{AllowedRoots: c.Security.AllowedRoots, OutputRoots: c.Security.WriteRoots(), SyncRoots: c.Security.SyncRoots(), MaxPixels: c.Security.MaxImagePixels, MaxBytes: int64(c.Security.MaxImageBytes)},
		SpoolDir: c.Security.SpoolDir,
	}
	w := wire(c, p, id, log, rt, env)
	w.adapter = adapter
	w.ready = opts.OnReady
	w.loader.onLoading, w.loader.skip = opts.OnLoading, skipModels(log)
	w.ctl.key = controlKey(log)
	if err := w.loader.loadAll(memBudget()); err != nil {
		w.Close()
		return nil, err
	}
	order, failed := w.models.names()
	log.Info("worker loaded", "runtime", rt.Version, "library", rt.Path, "ep", w.EP(), "models", order, "failed", failed)
	loadVips(log, c, p)
	return w, nil
}

// loadVips loads libvips, the image pipeline, at start when a model of the pool reads
// images, and warms its decode path (vips.Lib.WarmUp: each format's loader started, the
// heap faulted in), so that the first requests do not pay for it, and a missing libvips
// is said once, here (each image request then answers runtime_missing; the pool's raw models
// serve).
func loadVips(log *slog.Logger, c *config.Config, p *config.Pool) {
	for _, name := range p.Models {
		if mc := c.Models[name]; mc != nil && mc.Kind != config.KindRaw {
			if lib, err := vips.Default(); err != nil {
				log.Error("libvips not loaded: image requests answer runtime_missing", "error", err)
			} else {
				warmed, took := lib.WarmUp()
				log.Info("libvips loaded", "version", lib.Version, "library", lib.Path, "threads", lib.Threads,
					"formats_warmed", warmed, "warm_up_ms", took.Milliseconds())
			}
			return
		}
	}
}

// controlKey is the key the load and unload verbs are signed with (config.ControlKeyEnv),
// or nil: then the worker takes neither.
func controlKey(log *slog.Logger) []byte {
	k := os.Getenv(config.ControlKeyEnv)
	if k == "" {
		return nil
	}
	if key, err := hex.DecodeString(k); err == nil && len(key) >= codec.MinControlKey {
		return key
	}
	log.Error("the control key in the environment is not a key: this worker takes no load or unload", "var", config.ControlKeyEnv)
	return nil
}

// poolModels is pool p with the models config.PoolModelsEnv names, when it is set (the
// operators changed the pool's models at run time), else p. A model the file's [models]
// does not have is refused (unknown_model): the supervisor names only those.
func poolModels(c *config.Config, p *config.Pool) (*config.Pool, error) {
	v := os.Getenv(config.PoolModelsEnv)
	if v == "" {
		return p, nil
	}
	var names []string
	if len(v) > 1<<20 || json.Unmarshal([]byte(v), &names) != nil {
		return nil, codec.Errorf(codec.CodeBadRequest, "%s is not a JSON list of model names", config.PoolModelsEnv)
	}
	for _, m := range names {
		if c.Models[m] == nil {
			return nil, codec.Errorf(codec.CodeUnknownModel, "%s names model %q, which the config file does not have", config.PoolModelsEnv, m).With("model", m)
		}
	}
	np := *p
	np.Models = names
	return &np, nil
}

// skipModels reads the models not to load (config.SkipModelsEnv, set by the supervisor):
// a JSON object of model names and reasons, each reason bounded. A value that is not
// such an object skips nothing (logged).
func skipModels(log *slog.Logger) map[string]string {
	v := os.Getenv(config.SkipModelsEnv)
	if v == "" {
		return nil
	}
	var m map[string]string
	if len(v) > 1<<20 || json.Unmarshal([]byte(v), &m) != nil {
		log.Warn("ignoring an unreadable "+config.SkipModelsEnv, "bytes", len(v))
		return nil
	}
	for k, why := range m {
		m[k] = bounded(why)
	}
	return m
}

func memBudget() int64 {
	v, _ := strconv.ParseInt(os.Getenv(config.MemBudgetEnv), 10, 64)
	return v
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.id }

// Runtime is the loaded runtime; EP the execution provider in use.
func (w *Worker) Runtime() *ort.Runtime { return w.rt }

// EP is the execution provider the worker's sessions use ("" before a model is ready).
func (w *Worker) EP() string { return w.models.execProvider() }

// Close releases the models (the runtime stays loaded for the life of the process).
func (w *Worker) Close() {
	w.models.closeAll()
}

// snapshot is the worker's state as a heartbeat, read from each component.
func (w *Worker) snapshot() *codec.Heartbeat {
	queued, running, held := w.q.counts()
	state := codec.StateReady
	if w.serve.draining.Load() {
		state = codec.StateDraining
	}
	devBytes, devSource := w.dev.last()
	adapter := w.adapter
	if w.EP() != "webgpu" {
		adapter = adapterCheck{} // its sessions fell back: they run on no adapter
	}
	return &codec.Heartbeat{
		Worker: w.id, Pool: w.pool.Name, Host: w.host, PID: pid, State: state,
		Runtime: w.rt.Version, Library: w.rt.Path, EP: w.EP(), Device: w.pool.Device,
		Classes: w.pool.Classes, Models: w.models.statuses(), Slots: w.pool.Slots, Direct: true,
		Queued: queued, Running: running, Held: held,
		Served: w.reply.served.Load(), Failed: w.reply.failed.Load(), SessionsCreated: ort.SessionsCreated(),
		RSSBytes: rssBytes(), DeviceBytes: devBytes, DeviceSource: devSource, UptimeMS: time.Since(w.start).Milliseconds(),
		Adapter: adapter.adapter, AdapterMismatch: adapter.mismatch,
		Panics: guard.Panics(), PublishErrors: w.reply.publishErrors.Load(), BadMessages: w.serve.badMessages.Load(),
		DroppedReplies: w.reply.gate.dropped.Load(),
		DecodeWaitMS:   time.Duration(w.slots.decode.waited.Load()).Milliseconds(), InferMS: time.Duration(w.slots.inferred.Load()).Milliseconds(),
	}
}

// ReportFailure publishes one failed heartbeat for a worker that could not start, so
// gateways and operators see why (runtime_missing, provider_unavailable) on the bus.
func ReportFailure(nc *nats.Conn, pool, id string, err error) error {
	host, _ := os.Hostname()
	hb := &codec.Heartbeat{V: codec.WireVersion, Worker: id, Pool: pool, Host: host, PID: pid, State: codec.StateFailed,
		SentMS: time.Now().UnixMilli(), Error: codec.AsError(err)}
	subj, serr := subjects.Heartbeat(pool, id)
	if serr != nil {
		return serr
	}
	m, merr := health.Message(subj, hb)
	if merr != nil {
		return merr
	}
	if perr := nc.PublishMsg(m); perr != nil {
		return perr
	}
	return nc.FlushTimeout(500 * time.Millisecond)
}
