// Package worker is one resident ortbus worker: one ONNX Runtime library, one execution
// provider, the pool's models loaded once, serving infer.<pool>.<class> from the pool's
// queue group. It schedules its own slots by class priority, answers every work item
// exactly once, publishes heartbeats, honours cancels, and drains on shutdown.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/images"
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
}

// Worker is a loaded worker, ready to serve.
type Worker struct {
	cfg    *config.Config
	pool   *config.Pool
	id     string
	host   string
	log    *slog.Logger
	rt     *ort.Runtime
	ep     string
	models map[string]models.Model // by name
	order  []string                // model names in pool order
	stats  []codec.ModelStatus
	q      *queues
	start  time.Time
	ready  func(*Worker)

	rssBase        int64 // peak RSS before the next model's load
	served, failed atomic.Uint64
	publishErrors  atomic.Uint64
	badMessages    atomic.Uint64 // messages dropped for their reply subject (replyOK)
	replies        []string      // the reply prefixes it answers under (config NATS.Replies)
	draining       atomic.Bool
	nc             *nats.Conn // set by Serve
}

// New finds and loads the pool's runtime and opens its models. A runtime
// that cannot be found or loaded is a runtime_missing *codec.Error naming every searched
// path; an EP that cannot be used is provider_unavailable.
func New(opts Options) (*Worker, error) {
	c := opts.Config
	p, ok := c.Pools[opts.Pool]
	if !ok {
		return nil, codec.Errorf(codec.CodeUnknownPool, "pool %q is not in the config", opts.Pool)
	}
	w := &Worker{cfg: c, pool: p, id: opts.ID, log: opts.Logger, models: map[string]models.Model{}, start: time.Now(), ready: opts.OnReady, replies: c.NATS.Replies()}
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
	env := models.Env{
		Runtime:  rt,
		Session:  ort.PoolSessionConfig(p),
		Images:   images.Policy{AllowedRoots: c.Security.AllowedRoots, OutputRoots: c.Security.WriteRoots(), MaxPixels: c.Security.MaxImagePixels, MaxBytes: int64(c.Security.MaxImageBytes)},
		SpoolDir: c.Security.SpoolDir,
	}
	budget := memBudget()
	var admitted int64
	for _, name := range p.Models {
		mc := c.Models[name]
		t0 := time.Now()
		m, err := models.Open(env, mc)
		if err != nil {
			w.Close()
			if e, ok := err.(*codec.Error); ok {
				return nil, e.With("pool", p.Name).With("model", name)
			}
			return nil, fmt.Errorf("pool %s: model %s: %w", p.Name, name, err)
		}
		w.models[name] = m
		w.order = append(w.order, name)
		st := w.measure(m, mc, p, budget-admitted, budget > 0)
		st.LoadMS = time.Since(t0).Milliseconds()
		w.stats = append(w.stats, st)
		if s := m.Sessions(); len(s) > 0 {
			w.ep = s[0].EP
		}
		// Memory admission: the gateway passes what this worker may use on its device.
		admitted += st.PeakBytes
		if budget > 0 && admitted > budget {
			w.Close()
			return nil, codec.Errorf(codec.CodeOverloaded, "memory admission refused on device %s: models up to %s need %s, over this worker's budget of %s",
				p.Device, name, mib(admitted), mib(budget)).With("device", p.Device).With("sum_bytes", admitted).With("budget_bytes", budget).With("pool", p.Name)
		}
	}
	w.q = newQueues(c.ClassNames(), p.QueueBound, p.MaxBatch, p.MaxDelay.D())
	for _, st := range w.stats {
		w.q.caps[st.Name] = st.MaxBatch
	}
	w.log.Info("worker loaded", "runtime", rt.Version, "library", rt.Path, "ep", w.ep, "models", w.order)
	return w, nil
}

func memBudget() int64 {
	v, _ := strconv.ParseInt(os.Getenv(config.MemBudgetEnv), 10, 64)
	return v
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// measure finds a model's peak memory: declared in the config, or measured over loading
// and a warm-up at the pool's largest batch — the device's used memory on a GPU with a
// reader, else the growth of this process's peak RSS. A warm-up at batch 1 first gives
// the extra memory per batch item.
//
// With a budget (left bytes of it for this model), a dynamic batch whose peak would pass
// it is capped to the largest batch that fits.
func (w *Worker) measure(m models.Model, mc *config.Model, p *config.Pool, left int64, limited bool) codec.ModelStatus {
	maxBatch := max(1, p.MaxBatch)
	if mc.MaxBatch > 0 {
		maxBatch = min(maxBatch, mc.MaxBatch)
	}
	st := codec.ModelStatus{Name: mc.Name, Kind: mc.Kind, Loaded: true, MaxBatch: maxBatch}
	gpuBefore, onGPU := devices.Used(p.Device)
	ctx := context.Background()
	if err := m.Warmup(ctx, 1); err != nil {
		w.log.Warn("warm-up failed; peak not measured", "model", mc.Name, "err", err)
	}
	one := hwmBytes()
	if maxBatch > 1 {
		if err := m.Warmup(ctx, maxBatch); err != nil {
			w.log.Warn("warm-up at max batch failed", "model", mc.Name, "batch", maxBatch, "err", err)
		} else {
			st.PerItemBytes = max(0, hwmBytes()-one) / int64(maxBatch-1)
		}
	}
	switch {
	case mc.Memory > 0:
		st.PeakBytes, st.PeakSource = int64(mc.Memory), "declared"
	case onGPU:
		after, _ := devices.Used(p.Device)
		st.PeakBytes, st.PeakSource = max(0, after-gpuBefore), "device"
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

// ID is the worker's id.
func (w *Worker) ID() string { return w.id }

// Runtime is the loaded runtime; EP the execution provider in use.
func (w *Worker) Runtime() *ort.Runtime { return w.rt }

// EP is the execution provider the worker's sessions use.
func (w *Worker) EP() string { return w.ep }

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
	for _, m := range w.models {
		m.Close()
	}
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

// modelFor picks the model for a request: the named one, or the pool's first model that
// serves op (or, with no op either, the pool's first model and its first op).
func (w *Worker) modelFor(name, op string) (models.Model, string, error) {
	if name != "" {
		m, ok := w.models[name]
		if !ok {
			return nil, "", codec.Errorf(codec.CodeUnknownModel, "model %q is not loaded by pool %s (it has %v)", name, w.pool.Name, w.order).With("pool", w.pool.Name)
		}
		if op == "" {
			op = m.Ops()[0]
		}
		if !slices.Contains(m.Ops(), op) {
			return nil, "", codec.Errorf(codec.CodeUnknownOp, "model %s does not serve op %q (it serves %v)", name, op, m.Ops())
		}
		return m, op, nil
	}
	for _, n := range w.order {
		m := w.models[n]
		if op == "" {
			return m, m.Ops()[0], nil
		}
		if slices.Contains(m.Ops(), op) {
			return m, op, nil
		}
	}
	return nil, "", codec.Errorf(codec.CodeUnknownOp, "no model of pool %s serves op %q", w.pool.Name, op).With("pool", w.pool.Name)
}
