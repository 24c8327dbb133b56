package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ortbus/ortbus/cache"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/fault"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/models"
)

// loader loads the worker's models into its model set (modelSet): the pool's models at
// start-up (loadAll), and one model in place (reload: the control verb load), each
// measured (measure) and admitted within a memory budget. It owns what a load measures
// from: the process's peak RSS before the next load (rssBase), the floors of the models'
// peaks (peakFloors) and the device-memory sampler it reads (devMem). One load at a time
// (mu): two loads at once would each count the other's memory.
//
// A model is the unit of failure, not the pool: each model is loaded on its own, and one
// that fails (ONNX Runtime refuses it, its files are missing, an EP cannot run it, its
// load or warm-up panics) is failed with its reason while the worker serves the others.
type loader struct {
	cfg    *config.Config
	pool   *config.Pool
	worker string
	log    *slog.Logger
	// env and open load a model (open: models.Open; a test's fake).
	env  models.Env
	open opener
	// models is where a loaded model serves; caps is told its batch cap.
	models *modelSet
	caps   *queues
	peaks  *peakFloors
	dev    *devMem
	// skip are the models not to load, and why (config.SkipModelsEnv); onLoading is
	// called with each model's name before it loads (Options.OnLoading).
	skip      map[string]string
	onLoading func(model string)

	mu      sync.Mutex
	rssBase int64 // peak RSS before the next model's load, under mu
	// hasher hashes model files for their revision (revision), once per file while its
	// stat key holds: the revision taken after a load does not read the weights again.
	hasher     *cache.Hasher
	hasherOnce sync.Once
}

// opener opens one model (models.Open; a test's fake).
type opener func(models.Env, *config.Model) (models.Model, error)

func newLoader(c *config.Config, p *config.Pool, worker string, log *slog.Logger, env models.Env, ms *modelSet, caps *queues, dev *devMem) *loader {
	return &loader{cfg: c, pool: p, worker: worker, log: log, env: env, open: models.Open, models: ms, caps: caps, peaks: newPeakFloors(), dev: dev, rssBase: rssBytes()}
}

// loadAll loads the pool's models in order, each on its own (load), and records
// each one's status. Memory admission: the gateway passes what this worker may use on
// its device (budget, 0: no limit); the peaks of the ready models are summed as they
// load. A model whose peak would take the sum over the budget fails alone (overloaded in
// its load error; its sessions closed), as any failed model, and the others serve. Only
// a budget that leaves the worker nothing to serve — no model ready, one refused for
// memory — fails the worker (overloaded): its pool's failure, which a restart cannot fix.
// A failed model adds nothing to the sum.
func (l *loader) loadAll(budget int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pool
	var admitted int64
	var refused *codec.Error // the first model refused for memory
	ready := 0
	for _, name := range p.Models {
		mc := l.cfg.Models[name]
		if why, ok := l.skip[name]; ok {
			// A worker of this pool died natively while loading it: not again.
			l.models.fail(failedStatus(mc, codec.Errorf(codec.CodeWorkerLost, "not loaded: %s", why).With("model", name)), nil)
			l.log.Error("model skipped: a worker died while loading it", "model", name, "why", why)
			continue
		}
		if l.onLoading != nil {
			l.onLoading(name)
		}
		m, st := l.load(mc, budget-admitted, budget > 0)
		if m != nil && budget > 0 && admitted+st.PeakBytes > budget {
			closeQuietly(m)
			m, st = nil, l.overBudget(mc, st, admitted+st.PeakBytes, budget)
			if refused == nil {
				refused = st.Error
			}
		}
		if m == nil {
			l.models.fail(st, nil)
			l.log.Error("model failed to load; the worker serves the others", "model", name, "code", st.Error.Code, "err", st.Error.Message)
			// Whatever the failed load left in memory is not the next model's.
			l.rssBase = hwmBytes()
			continue
		}
		l.caps.setCap(name, st.MaxBatch)
		l.models.serve(m, st, nil)
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
func (l *loader) overBudget(mc *config.Model, st codec.ModelStatus, sum, budget int64) codec.ModelStatus {
	e := codec.Errorf(codec.CodeOverloaded, "model %s needs %s (peak, %s): the models up to it need %s, over this worker's memory budget of %s on device %s",
		mc.Name, mib(st.PeakBytes), st.PeakSource, mib(sum), mib(budget), l.pool.Device).
		With("model", mc.Name).With("device", l.pool.Device).With("sum_bytes", sum).With("budget_bytes", budget)
	fs := failedStatus(mc, e)
	fs.Error.Details = e.Details // failedStatus keeps only model, path, ep: these say why
	fs.PeakBytes, fs.PeakSource, fs.LoadMS, fs.WarmupError = st.PeakBytes, st.PeakSource, st.LoadMS, st.WarmupError
	return fs
}

// load opens one model and warms it up (measure). It returns the model and its
// ready status, or nil and a failed status with the load error: an error from open, or
// a panic in open or in the warm-up, recovered here (counted in the heartbeat's panics),
// after which the model's sessions are closed. A native crash while loading still ends
// the process. A warm-up that returns an error does not fail the model (see measure).
func (l *loader) load(mc *config.Model, left int64, limited bool) (m models.Model, st codec.ModelStatus) {
	t0 := time.Now()
	defer func() {
		if v := recover(); v != nil {
			guard.Count(l.log, "loading model "+mc.Name, v)
			if m != nil {
				closeQuietly(m)
			}
			m, st = nil, failedStatus(mc, codec.Errorf(codec.CodeInternal, "panic while loading model %s: %v", mc.Name, v))
		}
		st.LoadMS = time.Since(t0).Milliseconds()
	}()
	fault.Check(mc.Dir) // chaos tests only: a native crash while loading
	rev, frev := l.revision(mc), fileRev(mc)
	// The process's memory on its device before the model is opened: what the model's
	// sessions, its EP's context and its warm-up runs add to it is the model's (measure).
	devBefore, devOK := l.dev.now()
	m, err := l.open(l.env, mc)
	if err != nil {
		return nil, failedStatus(mc, err)
	}
	// Never below the peak measured at an earlier load of the same files (peaks.go).
	st = l.peaks.admit(frev, l.measure(m, mc, l.pool, left, limited, devBefore, devOK))
	// Where its nodes ran in the warm-ups (nodes_by_ep); a strict pool (cpu_fallback =
	// false) refuses a model with nodes off its EP (placement.go).
	if err := checkPlacement(l.env.Runtime, m, mc, l.pool, &st); err != nil {
		closeQuietly(m)
		fs := failedStatus(mc, err)
		fs.NodesByEP, fs.PeakBytes, fs.PeakSource = st.NodesByEP, st.PeakBytes, st.PeakSource
		return nil, fs
	}
	if rev != "" && l.revision(mc) == rev {
		st.Revision = rev // the files did not change while it loaded
	}
	return m, st
}

// revision is the revision of mc's files (cache.Revision) when the result cache is on,
// else "" (nothing reads it).
func (l *loader) revision(mc *config.Model) string {
	if l.cfg == nil || !l.cfg.Cache.Enabled {
		return ""
	}
	l.hasherOnce.Do(func() { l.hasher = cache.NewHasher(64) })
	rev, err := cache.Revision(l.hasher, mc)
	if err != nil {
		return ""
	}
	return rev
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
func (l *loader) measure(m models.Model, mc *config.Model, p *config.Pool, left int64, limited bool, devBefore int64, devOK bool) codec.ModelStatus {
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
	// status. A panic here fails the model (load).
	warmed := true
	if err := m.Warmup(ctx, 1); err != nil {
		l.log.Warn("warm-up failed; peak not measured", "model", mc.Name, "err", err)
		st.WarmupError = bounded(err.Error())
		warmed = false
	}
	one := hwmBytes()
	if maxBatch > 1 && warmed {
		if err := m.Warmup(ctx, maxBatch); err != nil {
			l.log.Warn("warm-up at max batch failed", "model", mc.Name, "batch", maxBatch, "err", err)
		} else {
			st.PerItemBytes = max(0, hwmBytes()-one) / int64(maxBatch-1)
		}
	}
	switch {
	case mc.Memory > 0:
		st.PeakBytes, st.PeakSource = int64(mc.Memory), "declared"
	case devOK && onDevice(m):
		after, ok := l.dev.now()
		if !ok {
			after = devBefore // the reader failed since: nothing measured
		}
		st.PeakBytes, st.PeakSource = max(0, after-devBefore), "device"
	default:
		st.PeakBytes, st.PeakSource = max(0, hwmBytes()-l.rssBase), "rss"
		peak1 := max(0, one-l.rssBase)
		if limited && st.PeakBytes > left && peak1 <= left && st.PerItemBytes > 0 {
			st.MaxBatch = min(maxBatch, 1+int((left-peak1)/st.PerItemBytes))
			st.PeakBytes = peak1 + int64(st.MaxBatch-1)*st.PerItemBytes
			l.log.Info("dynamic batch capped to fit the memory budget", "model", mc.Name, "max_batch", st.MaxBatch, "budget_left", mib(left))
		}
		l.rssBase = hwmBytes()
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

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// reload loads mc in place (inplace.go, rules 3 and 4), placed per order (the pool's
// models in force), within budget bytes (0: no limit), and returns its status, or the
// error it failed with.
func (l *loader) reload(mc *config.Model, budget int64, order []string) (codec.ModelStatus, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	serving := l.models.loading(mc.Name, mc.Kind, order)
	l.log.Info("loading a model in place", "model", mc.Name, "reload", serving, "budget", mib(budget))
	// What the process holds now is not the model's: its peak is measured from here.
	l.rssBase = resetPeak()
	m, st := l.load(mc, budget, budget > 0)
	if m != nil && budget > 0 && st.PeakBytes > budget {
		closeQuietly(m)
		m, st = nil, l.overBudget(mc, st, st.PeakBytes, budget)
	}
	if m == nil {
		l.rssBase = hwmBytes()
		what := "failed to load"
		if serving {
			what = "failed to load again (its new copy); the copy loaded before serves on"
		} else {
			l.models.fail(st, order)
		}
		l.log.Error("model "+what, "model", mc.Name, "code", st.Error.Code, "err", st.Error.Message)
		return st, codec.Errorf(st.Error.Code, "model %s %s on worker %s: %s", mc.Name, what, l.worker, st.Error.Message).
			With("model", mc.Name).With("worker", l.worker).With("pool", l.pool.Name).With("error", st.Error)
	}
	l.caps.setCap(mc.Name, st.MaxBatch)
	if old := l.models.serve(m, st, order); old != nil {
		l.log.Info("model reloaded; its old copy closes once its requests are answered", "model", mc.Name, "load_ms", st.LoadMS)
	} else {
		l.log.Info("model loaded in place", "model", mc.Name, "load_ms", st.LoadMS, "peak", mib(st.PeakBytes))
	}
	return st, nil
}
