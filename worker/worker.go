// Package worker is one resident ortbus worker: one ONNX Runtime library, one execution
// provider, the pool's models loaded once, serving infer.<pool>.<class> from the pool's
// queue group. It schedules its own slots by class priority, answers every work item
// exactly once, publishes heartbeats, honours cancels, and drains on shutdown.
package worker

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/cache"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/images/vips"
	"github.com/ortbus/ortbus/internal/fault"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/natsconn"
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

// Worker is a loaded worker, ready to serve.
type Worker struct {
	cfg  *config.Config
	pool *config.Pool
	id   string
	host string
	log  *slog.Logger
	rt   *ort.Runtime
	// models are the worker's models (modelSet: their one owner), ready, failed and
	// loading ones; a failed model's requests are answered model_unavailable (a model is
	// the unit of failure).
	models *modelSet
	q      *queues
	start  time.Time
	ready  func(*Worker)
	// env and open load a model (in place too: inplace.go); inplace is its one load at a
	// time.
	env     models.Env
	open    opener
	inplace inplace
	// controlKey checks the load and unload verbs' signatures (config.ControlKeyEnv: the
	// gateway that started the worker signs them); without it the worker takes neither.
	controlKey []byte
	// lastControl is the send time of the last load or unload taken: a body sent no later
	// is a replay (inplace.go, rule 1).
	lastControl atomic.Int64
	// hasher hashes model files for their revision (revision), once per file while its
	// stat key holds: the revision taken after a load does not read the weights again.
	hasher     *cache.Hasher
	hasherOnce sync.Once

	onLoading      func(model string) // Options.OnLoading
	skip           map[string]string  // models not to load, and why (config.SkipModelsEnv)
	rssBase        int64              // peak RSS before the next model's load
	dev            *devMem            // this process's own memory on its device (devmem.go)
	served, failed atomic.Uint64
	publishErrors  atomic.Uint64
	badMessages    atomic.Uint64 // messages dropped for their reply subject (checked)
	replies        []string      // the reply prefixes it answers under (config NATS.Replies)
	draining       atomic.Bool
	nc             *nats.Conn // set by Serve
}

// New finds and loads the pool's runtime and opens its models. A runtime
// that cannot be found or loaded is a runtime_missing *codec.Error naming every searched
// path; an EP chain none of which can be used is provider_unavailable; models over the
// memory budget are overloaded: those fail the pool, and New returns them.
//
// A model is the unit of failure, not the pool: each model is loaded on its own, and one
// that fails (ONNX Runtime refuses it, its files are missing, an EP cannot run it, its
// load or warm-up panics) is failed with its reason while the worker serves the others.
// A worker whose every model failed still starts, and answers model_unavailable.
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
	w := &Worker{cfg: c, pool: p, id: opts.ID, log: opts.Logger, models: newModelSet(), open: models.Open,
		start: time.Now(), ready: opts.OnReady, replies: c.NATS.Replies()}
	if w.id == "" {
		w.id = p.Name + "-" + nuid.Next()[16:]
	}
	if w.log == nil {
		w.log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	w.log = w.log.With("worker", w.id, "pool", p.Name)
	w.host, _ = os.Hostname()
	rt, err := ort.LoadSpec(ort.PoolSpec(p))
	if err != nil {
		if e := codec.AsError(err); e.Code == codec.CodeRuntimeMissing {
			e.With("pool", p.Name)
		}
		return nil, err
	}
	w.rt = rt
	w.rssBase = rssBytes()
	w.dev = newDevMem(p.Device)
	sc := ort.PoolSessionConfig(p, c.Spins(p.Name, runtime.NumCPU()))
	// An EP chain none of which the runtime can use at all (its provider library is
	// missing) fails every model alike: that is the pool's failure, as a missing runtime
	// is, and the worker does not start. An EP that refuses one model fails that model.
	if err := rt.ProbeChain(sc); err != nil {
		return nil, codec.AsError(err).With("pool", p.Name)
	}
	env := models.Env{
		Runtime:  rt,
		Session:  sc,
		Images:   images.Policy{AllowedRoots: c.Security.AllowedRoots, OutputRoots: c.Security.WriteRoots(), SyncRoots: c.Security.SyncRoots(), MaxPixels: c.Security.MaxImagePixels, MaxBytes: int64(c.Security.MaxImageBytes)},
		SpoolDir: c.Security.SpoolDir,
	}
	w.onLoading, w.skip, w.env = opts.OnLoading, skipModels(w.log), env
	if k := os.Getenv(config.ControlKeyEnv); k != "" {
		if key, err := hex.DecodeString(k); err == nil && len(key) >= codec.MinControlKey {
			w.controlKey = key
		} else {
			w.log.Error("the control key in the environment is not a key: this worker takes no load or unload", "var", config.ControlKeyEnv)
		}
	}
	if err := w.loadModels(env, w.open, memBudget()); err != nil {
		w.Close()
		return nil, err
	}
	w.q = newQueues(c.ClassNames(), p.QueueBound, p.MaxBatch, p.MaxDelay.D())
	for _, st := range w.models.statuses() {
		if st.State == codec.ModelReady {
			w.q.setCap(st.Name, st.MaxBatch)
		}
	}
	order, failed := w.models.names()
	w.log.Info("worker loaded", "runtime", rt.Version, "library", rt.Path, "ep", w.EP(), "models", order, "failed", failed)
	w.loadVips()
	return w, nil
}

// loadVips loads libvips, the image pipeline, at start when a model of the pool reads
// images, so that the first request does not pay for it and a missing libvips is said
// once, here (each image request then answers runtime_missing; the pool's raw models
// serve).
func (w *Worker) loadVips() {
	for _, name := range w.pool.Models {
		if mc := w.cfg.Models[name]; mc != nil && mc.Kind != config.KindRaw {
			if lib, err := vips.Default(); err != nil {
				w.log.Error("libvips not loaded: image requests answer runtime_missing", "error", err)
			} else {
				w.log.Info("libvips loaded", "version", lib.Version, "library", lib.Path, "threads", lib.Threads)
			}
			return
		}
	}
}

// opener opens one model (models.Open; a test's fake).
type opener func(models.Env, *config.Model) (models.Model, error)

// loadModels loads the pool's models in order, each on its own (loadModel), and records
// each one's status. Memory admission: the gateway passes what this worker may use on
// its device (budget, 0: no limit); the peaks of the ready models are summed as they
// load. A model whose peak would take the sum over the budget fails alone (overloaded in
// its load error; its sessions closed), as any failed model, and the others serve. Only
// a budget that leaves the worker nothing to serve — no model ready, one refused for
// memory — fails the worker (overloaded): its pool's failure, which a restart cannot fix.
// A failed model adds nothing to the sum.
func (w *Worker) loadModels(env models.Env, open opener, budget int64) error {
	p := w.pool
	var admitted int64
	var refused *codec.Error // the first model refused for memory
	ready := 0
	for _, name := range p.Models {
		mc := w.cfg.Models[name]
		if why, ok := w.skip[name]; ok {
			// A worker of this pool died natively while loading it: not again.
			w.models.fail(failedStatus(mc, codec.Errorf(codec.CodeWorkerLost, "not loaded: %s", why).With("model", name)), nil)
			w.log.Error("model skipped: a worker died while loading it", "model", name, "why", why)
			continue
		}
		if w.onLoading != nil {
			w.onLoading(name)
		}
		m, st := w.loadModel(env, open, mc, budget-admitted, budget > 0)
		if m != nil && budget > 0 && admitted+st.PeakBytes > budget {
			closeQuietly(m)
			m, st = nil, w.overBudget(mc, st, admitted+st.PeakBytes, budget)
			if refused == nil {
				refused = st.Error
			}
		}
		if m == nil {
			w.models.fail(st, nil)
			w.log.Error("model failed to load; the worker serves the others", "model", name, "code", st.Error.Code, "err", st.Error.Message)
			// Whatever the failed load left in memory is not the next model's.
			w.rssBase = hwmBytes()
			continue
		}
		w.models.serve(m, st, nil)
		admitted += st.PeakBytes
		ready++
	}
	if ready == 0 && refused != nil {
		return codec.Errorf(codec.CodeOverloaded, "memory admission refused on device %s: %s", p.Device, refused.Message).
			With("device", p.Device).With("sum_bytes", refused.Details["sum_bytes"]).With("budget_bytes", budget).With("pool", p.Name)
	}
	return nil
}

// overBudget is the failed status of model mc, loaded with status st, whose peak takes
// what the worker admits to sum bytes, over its budget: code overloaded, naming the
// device, the sum and the budget.
func (w *Worker) overBudget(mc *config.Model, st codec.ModelStatus, sum, budget int64) codec.ModelStatus {
	e := codec.Errorf(codec.CodeOverloaded, "model %s needs %s (peak, %s): the models up to it need %s, over this worker's memory budget of %s on device %s",
		mc.Name, mib(st.PeakBytes), st.PeakSource, mib(sum), mib(budget), w.pool.Device).
		With("model", mc.Name).With("device", w.pool.Device).With("sum_bytes", sum).With("budget_bytes", budget)
	fs := failedStatus(mc, e)
	fs.Error.Details = e.Details // failedStatus keeps only model, path, ep: these say why
	fs.PeakBytes, fs.PeakSource, fs.LoadMS, fs.WarmupError = st.PeakBytes, st.PeakSource, st.LoadMS, st.WarmupError
	return fs
}

// loadModel opens one model and warms it up (measure). It returns the model and its
// ready status, or nil and a failed status with the load error: an error from open, or
// a panic in open or in the warm-up, recovered here (counted in the heartbeat's panics),
// after which the model's sessions are closed. A native crash while loading still ends
// the process. A warm-up that returns an error does not fail the model (see measure).
func (w *Worker) loadModel(env models.Env, open opener, mc *config.Model, left int64, limited bool) (m models.Model, st codec.ModelStatus) {
	t0 := time.Now()
	defer func() {
		if v := recover(); v != nil {
			guard.Count(w.log, "loading model "+mc.Name, v)
			if m != nil {
				closeQuietly(m)
			}
			m, st = nil, failedStatus(mc, codec.Errorf(codec.CodeInternal, "panic while loading model %s: %v", mc.Name, v))
		}
		st.LoadMS = time.Since(t0).Milliseconds()
	}()
	fault.Check(mc.Dir) // chaos tests only: a native crash while loading
	rev := w.revision(mc)
	// The process's memory on its device before the model is opened: what the model's
	// sessions, its EP's context and its warm-up runs add to it is the model's (measure).
	devBefore, devOK := w.dev.now()
	m, err := open(env, mc)
	if err != nil {
		return nil, failedStatus(mc, err)
	}
	st = w.measure(m, mc, w.pool, left, limited, devBefore, devOK)
	if rev != "" && w.revision(mc) == rev {
		st.Revision = rev // the files did not change while it loaded
	}
	return m, st
}

// revision is the revision of mc's files (cache.Revision) when the result cache is on,
// else "" (nothing reads it).
func (w *Worker) revision(mc *config.Model) string {
	if w.cfg == nil || !w.cfg.Cache.Enabled {
		return ""
	}
	w.hasherOnce.Do(func() { w.hasher = cache.NewHasher(64) })
	rev, err := cache.Revision(w.hasher, mc)
	if err != nil {
		return ""
	}
	return rev
}

// closeQuietly closes a model that failed, ignoring its error and any panic.
func closeQuietly(m models.Model) {
	defer func() { recover() }()
	m.Close()
}

// maxLoadError bounds the message of a load error, and a warm-up error, as heartbeats
// carry them (the runtime's own text can be long), and maxLoadDetail each detail kept, so
// that a worker's heartbeat stays within the tracker's limits (health: 16 KiB each).
const (
	maxLoadError  = 4096
	maxLoadDetail = 1024
)

// failedStatus is the status of a model that failed with err: its code and message
// (bounded), and only the details that say which model, file and EP.
func failedStatus(mc *config.Model, err error) codec.ModelStatus {
	e := codec.AsError(err)
	le := &codec.Error{Code: e.Code, Message: bounded(e.Message)}
	for _, k := range []string{"model", "path", "ep"} {
		if v, ok := e.Details[k].(string); ok && len(v) <= maxLoadDetail {
			le.With(k, v)
		}
	}
	return codec.ModelStatus{Name: mc.Name, Kind: mc.Kind, State: codec.ModelFailed, Error: le}
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

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// measure finds a model's peak memory: declared in the config, or measured over loading
// and a warm-up at the pool's largest batch — on a device with a per-process reader and a
// model that runs there (an EP other than cpu), the growth of this process's own memory
// on the device from before the model was opened (devBefore) to after the warm-ups, else
// the growth of this process's peak RSS. Other processes on the same GPU do not enter it:
// the reading is this process's alone. A warm-up at batch 1 first gives the extra memory
// per batch item.
//
// The warm-ups are also where a GPU EP compiles its shaders and kernels (WebGPU: a second
// or more on its first run): loading pays for them, counted in the model's load_ms, not
// the first request.
//
// The largest batch is the pool's max_batch, lowered by the model's and by what its
// network takes in one call (models.Limit). With a budget (left bytes of it for this
// model), a dynamic batch whose peak would pass it is capped to the largest batch that
// fits.
func (w *Worker) measure(m models.Model, mc *config.Model, p *config.Pool, left int64, limited bool, devBefore int64, devOK bool) codec.ModelStatus {
	maxBatch := max(1, p.MaxBatch)
	if mc.MaxBatch > 0 {
		maxBatch = min(maxBatch, mc.MaxBatch)
	}
	// No more than the network takes in one call (models.BatchCap: a batch dimension
	// fixed at 1 takes one item, fixed at N at most N; a kind that batches nothing, 1):
	// the status's max_batch, the warm-up below and the queue's gathering (setCap) all
	// keep to it.
	maxBatch = models.Limit(m, maxBatch)
	st := codec.ModelStatus{Name: mc.Name, Kind: mc.Kind, State: codec.ModelReady, Loaded: true, MaxBatch: maxBatch}
	ctx := context.Background()
	fault.Panic(mc.Dir)
	// The warm-up runs on synthetic inputs (zeros, symbolic dimensions 64), which not
	// every model accepts (a VAD refuses a sample rate of 0): an error here says nothing
	// of the inputs it will get, so the model serves all the same, the error kept in its
	// status. A panic here fails the model (loadModel).
	warmed := true
	if err := m.Warmup(ctx, 1); err != nil {
		w.log.Warn("warm-up failed; peak not measured", "model", mc.Name, "err", err)
		st.WarmupError = bounded(err.Error())
		warmed = false
	}
	one := hwmBytes()
	if maxBatch > 1 && warmed {
		if err := m.Warmup(ctx, maxBatch); err != nil {
			w.log.Warn("warm-up at max batch failed", "model", mc.Name, "batch", maxBatch, "err", err)
		} else {
			st.PerItemBytes = max(0, hwmBytes()-one) / int64(maxBatch-1)
		}
	}
	switch {
	case mc.Memory > 0:
		st.PeakBytes, st.PeakSource = int64(mc.Memory), "declared"
	case devOK && onDevice(m):
		after, ok := w.dev.now()
		if !ok {
			after = devBefore // the reader failed since: nothing measured
		}
		st.PeakBytes, st.PeakSource = max(0, after-devBefore), "device"
	default:
		st.PeakBytes, st.PeakSource = max(0, hwmBytes()-w.rssBase), "rss"
		peak1 := max(0, one-w.rssBase)
		if limited && st.PeakBytes > left && peak1 <= left && st.PerItemBytes > 0 {
			st.MaxBatch = min(maxBatch, 1+int((left-peak1)/st.PerItemBytes))
			st.PeakBytes = peak1 + int64(st.MaxBatch-1)*st.PerItemBytes
			w.log.Info("dynamic batch capped to fit the memory budget", "model", mc.Name, "max_batch", st.MaxBatch, "budget_left", mib(left))
		}
		w.rssBase = hwmBytes()
	}
	return st
}

// onDevice reports whether one of m's sessions runs on an EP other than the CPU's (a
// webgpu pool's model that fell back to cpu is measured by its RSS).
func onDevice(m models.Model) bool {
	for _, s := range m.Sessions() {
		if s != nil && s.EP != "" && s.EP != "cpu" {
			return true
		}
	}
	return false
}

// bounded is s cut to at most maxLoadError bytes, at a character boundary.
func bounded(s string) string {
	if len(s) <= maxLoadError {
		return s
	}
	i := maxLoadError
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// ID is the worker's id.
func (w *Worker) ID() string { return w.id }

// Runtime is the loaded runtime; EP the execution provider in use.
func (w *Worker) Runtime() *ort.Runtime { return w.rt }

// EP is the execution provider the worker's sessions use ("" before a model is ready).
func (w *Worker) EP() string { return w.models.execProvider() }

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

// Close releases the models (the runtime stays loaded for the life of the process).
func (w *Worker) Close() {
	w.models.closeAll()
}

// ErrConnectionLost is what Serve and ServeConn return, wrapped with the connection's
// last error, when the NATS connection is closed for good under them (see ServeConn).
var ErrConnectionLost = errors.New("NATS connection closed for good")

// Serve connects to NATS at url, subscribes and serves until ctx is cancelled, then
// drains: no new work, every queued item answered, a last heartbeat, and returns nil.
// A connection closed for good first ends it with ErrConnectionLost (ServeConn).
func (w *Worker) Serve(ctx context.Context, url string, natsOpts ...nats.Option) error {
	// The pool's own NATS identity when it has one ([pools.NAME.nats]); then a user:password
	// in the URL (the gateway's) must not log it in as someone else.
	opts, err := natsconn.Options(w.cfg.WorkerNATS(w.pool.Name), "ortworker "+w.id)
	if err != nil {
		return err
	}
	if w.pool.HasCredentials() {
		url = natsconn.StripUserInfo(url)
	}
	opts = append(append(opts, nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
		w.log.Warn("nats error", "subject", subjectOf(s), "err", err)
	})), natsOpts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", url, err)
	}
	defer nc.Close()
	return w.ServeConn(ctx, nc)
}

// ServeConn serves on an existing connection (see Serve).
//
// The connection reconnects for ever while the server is away (natsconn.Reconnect), but
// nats.go closes it for good on a fatal server error ("maximum control line exceeded")
// or on the same authorization error twice when reconnecting (a rotated password). A
// worker that went on would serve nothing while its process looked alive, so ServeConn
// then stops (lost) and returns ErrConnectionLost: ortworker exits non-zero and its
// supervisor (the gateway, systemd) restarts it. ServeConn itself never closes nc, so
// every close it sees while serving is such a loss.
func (w *Worker) ServeConn(ctx context.Context, nc *nats.Conn) error {
	w.nc = nc
	closed, unwatch := connClosed(nc)
	defer unwatch()
	var subs []*nats.Subscription
	for _, class := range w.pool.Classes {
		s, err := w.subscribe(nc, class)
		if err != nil {
			return err
		}
		subs = append(subs, s...)
	}
	ctl, err := w.control(nc)
	if err != nil {
		return err
	}
	pub, err := w.heartbeats(nc)
	if err != nil {
		return err
	}
	hbCtx, stopHB := context.WithCancel(context.Background())
	var hbDone sync.WaitGroup
	hbDone.Add(1)
	go func() { defer hbDone.Done(); pub.Run(hbCtx, nil) }()
	hbDone.Add(1)
	go func() { defer hbDone.Done(); w.dev.run(hbCtx, w.cfg.Health.HeartbeatInterval.D()) }()

	var slots sync.WaitGroup
	for i := 0; i < w.pool.Slots; i++ {
		slots.Add(1)
		go func() { defer slots.Done(); w.slot(nc) }()
	}
	if err := nc.Flush(); err != nil {
		w.log.Warn("NATS flush after subscribing failed; serving once reconnected", "err", err)
	}
	w.log.Info("serving", "classes", w.pool.Classes, "slots", w.pool.Slots)
	if w.ready != nil {
		w.ready(w)
	}

	select {
	case <-ctx.Done():
	case <-closed:
		err := w.lost(nc)
		slots.Wait()
		stopHB()
		hbDone.Wait()
		return err
	}

	// Drain: stop taking work (pending messages already in the client are still
	// delivered to the handler and queued or answered), finish what is queued, say so.
	// A loss meanwhile ends the drain: what is left cannot be answered (lost).
	w.draining.Store(true)
	drained := make(chan struct{})
	lostWhileDraining := make(chan error, 1)
	go func() {
		select {
		case <-closed:
			lostWhileDraining <- w.lost(nc)
		case <-drained:
			lostWhileDraining <- nil
		}
	}()
	for _, s := range subs {
		s.Drain()
	}
	for _, s := range subs {
		waitClosed(s, closed)
	}
	w.q.idle()
	w.q.close()
	slots.Wait()
	close(drained)
	for _, s := range ctl {
		s.Unsubscribe()
	}
	stopHB()
	hbDone.Wait()
	if err := <-lostWhileDraining; err != nil {
		return err
	}
	pub.Beat()
	w.log.Info("drained", "served", w.served.Load(), "failed", w.failed.Load())
	return nc.Flush()
}

// lost stops the work of a worker whose connection nc is closed for good, and returns
// the error that says so (ErrConnectionLost with nc's last error): no answer can be sent
// any more, so nothing is drained. Queued items are dropped and running ones cancelled
// (their gateways retry them on another worker, or answer them); the queues close, so
// the slots end.
func (w *Worker) lost(nc *nats.Conn) error {
	err := nc.LastError()
	if err == nil {
		err = nats.ErrConnectionClosed
	}
	w.log.Error("NATS connection closed for good; the worker stops", "err", err)
	w.draining.Store(true)
	w.q.close()
	_, _, held := w.q.counts()
	for _, id := range held {
		if j, _ := w.q.cancel(id); j != nil && j.cancel != nil {
			j.cancel()
		}
	}
	return fmt.Errorf("%w: %w", ErrConnectionLost, err)
}

// connClosed returns a channel closed once nc is closed (nats.go's status events), so
// that every wait of ServeConn can end on it, and the function that stops the watch.
func connClosed(nc *nats.Conn) (<-chan struct{}, func()) {
	ch := nc.StatusChanged(nats.CLOSED)
	done := make(chan struct{})
	go func() {
		if _, ok := <-ch; ok {
			close(done)
		}
	}()
	return done, func() { nc.RemoveStatusListener(ch) }
}

// waitClosed waits until a draining subscription has handed over every pending message,
// or the connection is closed (which ends the subscription without a status event).
func waitClosed(s *nats.Subscription, connClosed <-chan struct{}) {
	ch := s.StatusChanged(nats.SubscriptionClosed)
	if !s.IsValid() {
		return
	}
	select {
	case <-ch:
	case <-connClosed:
	case <-time.After(30 * time.Second):
	}
}

func subjectOf(s *nats.Subscription) string {
	if s == nil {
		return ""
	}
	return s.Subject
}

// modelFor picks the model for a request: the named one, or the pool's first ready model
// that serves op (or, with no op either, the pool's first ready model and its first op).
// A failed model is answered model_unavailable: named, or when it is the only model of
// the pool for op. The copy it returns is held by the request until its answer
// (modelSet, rule 2: answer releases it).
func (w *Worker) modelFor(name, op string) (models.Model, string, error) {
	s := w.models
	s.mu.Lock()
	defer s.mu.Unlock()
	if name != "" {
		l, ok := s.ready[name]
		if !ok {
			if le := s.failed[name]; le != nil {
				return nil, "", w.unavailable(name, le)
			}
			if st, ok := s.status[name]; ok && st.State == codec.ModelLoading {
				return nil, "", codec.Errorf(codec.CodeUnknownModel, "model %q is still loading on worker %s", name, w.id).With("pool", w.pool.Name).With("worker", w.id)
			}
			return nil, "", codec.Errorf(codec.CodeUnknownModel, "model %q is not loaded by pool %s (it has %v)", name, w.pool.Name, s.order).With("pool", w.pool.Name)
		}
		if op == "" {
			op = l.Ops()[0]
		}
		if !slices.Contains(l.Ops(), op) {
			return nil, "", codec.Errorf(codec.CodeUnknownOp, "model %s does not serve op %q (it serves %v)", name, op, l.Ops())
		}
		l.uses++
		return l, op, nil
	}
	failed := ""
	for _, n := range s.order {
		l, ok := s.ready[n]
		if !ok {
			if s.failed[n] != nil && failed == "" && (op == "" || kindServes(s.status[n].Kind, op)) {
				failed = n
			}
			continue
		}
		if op == "" {
			l.uses++
			return l, l.Ops()[0], nil
		}
		if slices.Contains(l.Ops(), op) {
			l.uses++
			return l, op, nil
		}
	}
	if failed != "" {
		return nil, "", w.unavailable(failed, s.failed[failed])
	}
	return nil, "", codec.Errorf(codec.CodeUnknownOp, "no model of pool %s serves op %q", w.pool.Name, op).With("pool", w.pool.Name)
}

// kindServes reports whether model kind serves op.
func kindServes(kind, op string) bool {
	k, ok := config.KindOf(kind)
	return ok && slices.Contains(k.Ops, op)
}

// unavailable is the model_unavailable answer for the failed model name: its load error
// le in details.error.
func (w *Worker) unavailable(name string, le *codec.Error) *codec.Error {
	if le == nil {
		le = codec.Errorf(codec.CodeInternal, "unknown load error")
	}
	return codec.Errorf(codec.CodeModelUnavailable, "model %s failed to load on worker %s: %s", name, w.id, le.Message).
		With("model", name).With("pool", w.pool.Name).With("worker", w.id).With("error", le)
}
