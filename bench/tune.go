package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/npy"
	"github.com/ortbus/ortbus/subjects"
)

// Tune measures a pool's layouts on this machine and picks one (anchor: Triton's Model
// Analyzer sweeps): workers × intra-op threads (workers × threads at most the machine's
// cores) × spinning (off, on) × max_batch (1, and 8 where the model's kind batches), each
// layout a real gateway and its workers on the pool's model under a load of batch
// requests kept in flight. Per layout: items/s, latency p50/p95 (send to answer, queueing
// included), and CPU per item (the workers' user + system time over the items). The
// winner has the most items/s among the layouts whose p95 meets the latency bound (all,
// without one); -write puts it in the config file's pool table.
//
// With -ep webgpu (Options.EP) every layout runs the pool on ONNX Runtime's WebGPU EP on
// Options.Device (default: the GPU findGPU finds, else cpu: lavapipe), strict (no
// fallback), and the sweep is workers 1..4 (within the cores) × max_batch (1, 8 where the
// model batches), one intra-op thread, spinning off: the GPU runs the model, the CPU
// threads only what the EP leaves to the CPU.

// TuneOptions configure a tune.
type TuneOptions struct {
	Options
	// Config is the config file; Pool the pool to tune; Model its model to run (default:
	// the pool's first).
	Config, Pool, Model string
	// Inputs are the .npy files of an infer model's inputs, by input name; Image the
	// image path of another kind's requests (inside the config's allowed roots).
	Inputs map[string]string
	Image  string
	// Duration is the measured time per layout (default 3s); Latency the p95 bound (0:
	// none).
	Duration, Latency time.Duration
	// Write puts the winner in the config file.
	Write bool
}

// Layout is one way to run a pool.
type Layout struct {
	Workers  int  `json:"workers"`
	Threads  int  `json:"threads"`
	Spin     bool `json:"spin"`
	MaxBatch int  `json:"max_batch"`
}

func (l Layout) String() string {
	return fmt.Sprintf("%d×%d spin=%v batch=%d", l.Workers, l.Threads, l.Spin, l.MaxBatch)
}

// TuneRow is one layout's measurement.
type TuneRow struct {
	Layout
	ItemsPerSec float64 `json:"items_per_sec"`
	P50MS       float64 `json:"p50_ms"`
	P95MS       float64 `json:"p95_ms"`
	CPUPerItem  float64 `json:"cpu_ms_per_item"`
	Err         string  `json:"error,omitempty"`
	// MemoryCheck is, for a webgpu layout on a GPU, its workers' device_bytes against the
	// device's own growth (memcheck.go).
	MemoryCheck *MemCheck `json:"memory_check,omitempty"`
}

// TuneResults are a tune's rows and its winner.
type TuneResults struct {
	Pool    string    `json:"pool"`
	Model   string    `json:"model"`
	Op      string    `json:"op"`
	Rows    []TuneRow `json:"rows"`
	Winner  *TuneRow  `json:"winner"`
	Current Layout    `json:"current"`
	Written bool      `json:"written"`
	// EP is the execution provider of every layout (the pool's own, or -ep's); Device
	// its device; Adapter, on webgpu, the Vulkan device Dawn takes (dawnPick); GPU what the
	// machine's GPU check found (webgpu).
	EP      string `json:"ep"`
	Device  string `json:"device,omitempty"`
	Adapter string `json:"adapter,omitempty"`
	GPU     string `json:"gpu,omitempty"`
}

// Tune runs the sweep and prints its table and winner on o.Out.
func Tune(ctx context.Context, o TuneOptions) (*TuneResults, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	out := o.Out
	if out == nil {
		out = os.Stdout
	}
	cfg, err := config.Load(o.Config)
	if err != nil {
		return nil, err
	}
	pc, model, kind, err := tunedPool(cfg, o)
	if err != nil {
		return nil, err
	}
	res := &TuneResults{Pool: o.Pool, Model: model, Op: kind.Ops[0], EP: pc.EP, Device: pc.Device,
		Current: Layout{Workers: pc.Workers, Threads: pc.Threads, Spin: cfg.Spins(o.Pool, runtime.NumCPU()), MaxBatch: max(1, pc.MaxBatch)}}
	dir, err := os.MkdirTemp("", "ortbus-tune-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sweep := layouts(runtime.NumCPU(), slices.Contains(kind.Batch, res.Op))
	if o.EP != "" && o.EP != pc.EP && o.EP != "webgpu" {
		return nil, fmt.Errorf("tune: -ep %s: want webgpu (or the pool's own ep, %s)", o.EP, pc.EP)
	}
	base := *pc
	if orDefault(o.EP, pc.EP) == "webgpu" {
		restore, err := tuneOnWebGPU(ctx, o, pc, &base, res, dir)
		if err != nil {
			return nil, err
		}
		defer restore()
		sweep = webgpuLayouts(runtime.NumCPU(), slices.Contains(kind.Batch, res.Op))
	}
	w := &workdir{dir: dir}
	if err := os.Mkdir(filepath.Join(dir, "spool"), 0o755); err != nil {
		return nil, err
	}
	req, err := tuneRequest(kind, o, dir)
	if err != nil {
		return nil, err
	}
	if len(req.InputPaths) != len(o.Inputs) {
		return nil, fmt.Errorf("tune: the inputs could not be written as .npy files in %s", dir)
	}
	fmt.Fprintf(out, "tune: pool %s, model %s (%s), %s per layout, %d cores%s\n", o.Pool, model, res.Op, positiveOr(o.Duration, 3*time.Second), runtime.NumCPU(), latencyNote(o.Latency))
	if res.Adapter != "" {
		fmt.Fprintf(out, "ep: %s on device %s, strict (no fallback); GPU check: %s; adapter: %s (the Vulkan device Dawn takes)\n", res.EP, res.Device, res.GPU, res.Adapter)
	}
	for _, l := range sweep {
		row := TuneRow{Layout: l}
		if err := tuneOne(ctx, o, cfg, &base, model, res.Op, l, req, w, &row); err != nil {
			row.Err = err.Error()
		}
		res.Rows = append(res.Rows, row)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	for i := range res.Rows {
		r := &res.Rows[i]
		if r.Err == "" && (o.Latency == 0 || r.P95MS <= float64(o.Latency)/1e6) && (res.Winner == nil || r.ItemsPerSec > res.Winner.ItemsPerSec) {
			res.Winner = r
		}
	}
	printTune(out, res)
	if res.Winner == nil {
		return res, fmt.Errorf("tune: no layout ran%s", latencyNote(o.Latency))
	}
	fmt.Fprintf(out, "winner: %s (%.2f items/s, p95 %.1f ms)\n", res.Winner.Layout, res.Winner.ItemsPerSec, res.Winner.P95MS)
	if o.Write {
		if err := writeWinner(out, o, cfg, res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// tunedPool is the pool -pool names (a local one) and the model tuned: -model, or the
// pool's first, with its kind.
func tunedPool(cfg *config.Config, o TuneOptions) (*config.Pool, string, config.Kind, error) {
	pc := cfg.Pools[o.Pool]
	if pc == nil || !pc.IsLocal() {
		return nil, "", config.Kind{}, fmt.Errorf("tune: %q is not a local pool of %s", o.Pool, o.Config)
	}
	model := o.Model
	if model == "" && len(pc.Models) > 0 {
		model = pc.Models[0]
	}
	mc := cfg.Models[model]
	if mc == nil || !slices.Contains(pc.Models, model) {
		return nil, "", config.Kind{}, fmt.Errorf("tune: pool %s does not load model %q", o.Pool, model)
	}
	kind, _ := config.KindOf(mc.Kind)
	return pc, model, kind, nil
}

// tuneOnWebGPU prepares a sweep on webgpu: the adapter and device (in res), the
// environment Dawn needs (restore puts it back), and base made strict on webgpu.
func tuneOnWebGPU(ctx context.Context, o TuneOptions, pc, base *config.Pool, res *TuneResults, dir string) (func(), error) {
	gpu := detectGPU()
	_, pick, err := probeAdapter(ctx)
	if err != nil {
		return nil, fmt.Errorf("tune -ep webgpu: %w", err)
	}
	if err := gpu.checkAdapter(pick); err != nil {
		return nil, fmt.Errorf("tune -ep webgpu: %w", err)
	}
	device := o.Device
	if device == "" && pc.EP == "webgpu" {
		device = pc.Device
	}
	res.EP, res.Device, res.Adapter, res.GPU = "webgpu", orDefault(device, orDefault(gpu.Device, "cpu")), pick.String(), gpu.What
	restore, err := webgpuEnv(dir)
	if err != nil {
		return nil, err
	}
	// Every layout strict on webgpu, whatever the pool's own EP chain.
	base.EP, base.Device, base.Fallback = res.EP, res.Device, nil
	if pc.EP != "webgpu" {
		base.EPOptions = nil
	}
	return restore, nil
}

// printTune prints the sweep's table, the current layout and the winner marked.
func printTune(out io.Writer, res *TuneResults) {
	var rows []string
	for _, r := range res.Rows {
		mark := ""
		if r.Layout == res.Current {
			mark = " (current)"
		}
		if r == deref(res.Winner) {
			mark += " <- winner"
		}
		if r.Err != "" {
			rows = append(rows, fmt.Sprintf("%d\t%d\t%v\t%d\t-\t-\t-\t-\t%s", r.Workers, r.Threads, r.Spin, r.MaxBatch, oneLine(r.Err)))
			continue
		}
		rows = append(rows, fmt.Sprintf("%d\t%d\t%v\t%d\t%.2f\t%.1f\t%.1f\t%.1f\t%s", r.Workers, r.Threads, r.Spin, r.MaxBatch, r.ItemsPerSec, r.P50MS, r.P95MS, r.CPUPerItem, strings.TrimSpace(mark)))
	}
	printTable(out, "workers\tthreads\tspin\tmax_batch\titems/s\tp50 ms\tp95 ms\tcpu ms/item\t", rows...)
	for _, r := range res.Rows {
		if m := r.MemoryCheck; m != nil {
			fmt.Fprintf(out, "memory check, %s: workers %s, device grew by %s (other processes subtracted), off %.1f%%: %s\n",
				r.Layout, mibText(m.WorkersBytes), mibText(m.DeviceBytes), 100*m.Off, m.Verdict)
		}
	}
}

// writeWinner writes the winner's layout into the pool's table of the config file (and
// its EP and device, when measured on another EP than the file's).
func writeWinner(out io.Writer, o TuneOptions, cfg *config.Config, res *TuneResults) error {
	keys := winnerKeys(res.Winner.Layout)
	if res.EP != cfg.Pools[o.Pool].EP || res.Device != cfg.Pools[o.Pool].Device {
		// Measured on another EP than the file's: the winner is that EP's layout.
		keys["ep"], keys["device"] = strconv.Quote(res.EP), strconv.Quote(res.Device)
	}
	if err := config.EditPool(o.Config, o.Pool, keys); err != nil {
		return err
	}
	res.Written = true
	fmt.Fprintf(out, "written to [pools.%s] of %s\n", o.Pool, o.Config)
	return nil
}

func deref(r *TuneRow) TuneRow {
	if r == nil {
		return TuneRow{Err: "none"}
	}
	return *r
}

func latencyNote(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf(" (p95 bound %s)", d)
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

// winnerKeys are the pool keys of l, as TOML values.
func winnerKeys(l Layout) map[string]string {
	return map[string]string{"workers": strconv.Itoa(l.Workers), "threads": strconv.Itoa(l.Threads),
		"spin": strconv.FormatBool(l.Spin), "max_batch": strconv.Itoa(l.MaxBatch)}
}

// layouts are the layouts of a sweep on cpus cores: workers × threads ≤ cpus, spinning
// off and on, max_batch 1 (and 8 when the op batches).
func layouts(cpus int, batches bool) []Layout {
	var out []Layout
	mbs := []int{1}
	if batches {
		mbs = append(mbs, 8)
	}
	for w := 1; w <= cpus; w++ {
		for t := 1; w*t <= cpus; t++ {
			for _, spin := range []bool{false, true} {
				for _, mb := range mbs {
					out = append(out, Layout{Workers: w, Threads: t, Spin: spin, MaxBatch: mb})
				}
			}
		}
	}
	return out
}

// webgpuLayouts are the layouts of a webgpu sweep on cpus cores: workers 1..4 (at most
// cpus) × max_batch 1 (and 8 when the op batches), one intra-op thread, spinning off.
func webgpuLayouts(cpus int, batches bool) []Layout {
	var out []Layout
	mbs := []int{1}
	if batches {
		mbs = append(mbs, 8)
	}
	for w := 1; w <= min(4, max(cpus, 1)); w++ {
		for _, mb := range mbs {
			out = append(out, Layout{Workers: w, Threads: 1, MaxBatch: mb})
		}
	}
	return out
}

// tuneRequest is the request every item of the sweep sends: infer with the inputs read
// from their .npy files (inline), or the op of another kind on the image.
func tuneRequest(kind config.Kind, o TuneOptions, dir string) (*codec.Request, error) {
	req := &codec.Request{Class: subjects.ClassBatch, TimeoutMS: 120_000}
	if kind.Ops[0] == "infer" {
		if len(o.Inputs) == 0 {
			return nil, fmt.Errorf("tune: an infer model needs its inputs: -input NAME=FILE.npy, once per input")
		}
		// Inputs and outputs go by path (.npy in the tune's own directory), as a large
		// tensor does in production: inline they may pass the bus's payload limit.
		inputs := map[string]*codec.Tensor{}
		req.InputPaths = map[string]string{}
		defer func() {
			for name, t := range inputs {
				b, err := npy.Encode(t)
				if err == nil {
					p := filepath.Join(dir, "in-"+strconv.Itoa(len(req.InputPaths))+".npy")
					if err = os.WriteFile(p, b, 0o644); err == nil {
						req.InputPaths[name] = p
					}
				}
			}
		}()
		for name, path := range o.Inputs {
			if spec, ok := strings.CutPrefix(path, "zeros:"); ok {
				t, err := zerosTensor(spec)
				if err != nil {
					return nil, fmt.Errorf("tune: input %s: %w", name, err)
				}
				inputs[name] = t
				continue
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, err
			}
			t, err := npy.Decode(b)
			if err != nil {
				return nil, fmt.Errorf("tune: input %s: %w", name, err)
			}
			inputs[name] = t
		}
		return req, nil
	}
	if o.Image == "" {
		return nil, fmt.Errorf("tune: a %s model needs an image: -image FILE (inside the config's allowed roots)", kind.Name)
	}
	req.Path = o.Image
	return req, nil
}

// tuneOne starts a system of the pool (base, the config's pool with -ep applied) in layout
// l alone and measures it into row.
func tuneOne(ctx context.Context, o TuneOptions, user *config.Config, base *config.Pool, model, op string, l Layout, req *codec.Request, w *workdir, row *TuneRow) error {
	c, pc := tuneConfig(o, user, base, model, l, w)
	name := fmt.Sprintf("tune-%d-%d-%v-%d", l.Workers, l.Threads, l.Spin, l.MaxBatch)
	path := filepath.Join(w.dir, name+".toml")
	if err := config.Write(path, c); err != nil {
		return err
	}
	gpu := pc.EP == "webgpu" && (strings.HasPrefix(pc.Device, "cuda:") || strings.HasPrefix(pc.Device, "drm:"))
	var before DeviceReading
	var beforeErr error
	if gpu {
		before, beforeErr = readDevice(pc.Device)
	}
	sys, err := startSystem(ctx, &o.Options, w, name, path)
	if err != nil {
		return err
	}
	defer sys.stop()
	if gpu {
		row.MemoryCheck = checkSystem(ctx, name, pc.Device, sys, before, beforeErr)
	}
	st, err := sys.status(ctx)
	if err != nil {
		return err
	}
	pids, err := tuneWorkers(st, o.Pool, pc)
	if err != nil {
		return err
	}
	tl := &tuneLoad{sys: sys, op: op, req: req, w: w, inflight: 2 * l.Workers * l.MaxBatch}
	d := positiveOr(o.Duration, 3*time.Second)
	if _, _, err := tl.run(ctx, min(d, time.Second)); err != nil { // warm-up
		return err
	}
	cpu0 := cpuTicks(pids)
	n, lat, err := tl.run(ctx, d)
	if err != nil {
		return err
	}
	cpu := cpuTicks(pids) - cpu0
	if n == 0 {
		return fmt.Errorf("no answer within %s", d)
	}
	slices.Sort(lat)
	row.ItemsPerSec = perSecond(n, d)
	row.P50MS = float64(lat[len(lat)/2]) / 1e6
	row.P95MS = float64(lat[min(len(lat)-1, len(lat)*95/100)]) / 1e6
	row.CPUPerItem = float64(cpu) * 10 / float64(n) // clock ticks of 10 ms (USER_HZ 100)
	return nil
}

// tuneConfig is the configuration of layout l's system: the pool (base in layout l, one
// slot, batch class only, the model alone) with the user's security, devices and model,
// the work directory allowed and its spool.
func tuneConfig(o TuneOptions, user *config.Config, base *config.Pool, model string, l Layout, w *workdir) (*config.Config, *config.Pool) {
	pc := *base
	pc.Workers, pc.Threads, pc.Spin, pc.MaxBatch, pc.Slots = l.Workers, l.Threads, l.Spin, l.MaxBatch, 1
	pc.Classes, pc.Models, pc.LazyLoad, pc.KeepAlive = []string{subjects.ClassBatch}, []string{model}, false, ""
	sec := user.Security
	sec.AllowedRoots = append(slices.Clone(sec.AllowedRoots), w.dir)
	sec.SpoolDir = filepath.Join(w.dir, "spool")
	return &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Security: sec,
		Devices:  user.Devices,
		Classes:  map[string]*config.Class{subjects.ClassBatch: {Priority: 2, Chain: []string{o.Pool}, QueueBound: 4096, Timeout: config.Duration(2 * time.Minute), MaxTimeout: config.Duration(2 * time.Minute)}},
		Pools:    map[string]*config.Pool{o.Pool: &pc},
		Models:   map[string]*config.Model{model: user.Models[model]},
	}, &pc
}

// tuneWorkers are the pids of the pool's workers (for their CPU time); on webgpu, a
// worker on another EP or device than the pool's is an error.
func tuneWorkers(st *codec.StatusReply, pool string, pc *config.Pool) ([]int, error) {
	var pids []int
	for _, wk := range st.Workers {
		if wk.Pool == pool && wk.PID > 0 {
			pids = append(pids, wk.PID)
		}
		if wk.Pool == pool && pc.EP == "webgpu" && (wk.EP != pc.EP || wk.Device != pc.Device) {
			return nil, fmt.Errorf("worker %s runs ep %q on device %q, not %s on %s", wk.Worker, wk.EP, wk.Device, pc.EP, pc.Device)
		}
	}
	return pids, nil
}

// tuneLoad is the load on a layout's system: req sent as op, inflight requests at a time.
type tuneLoad struct {
	sys      *system
	op       string
	req      *codec.Request
	w        *workdir
	inflight int
}

// run sends the load for d and returns the answers within d and their latencies (and
// the first error).
func (tl *tuneLoad) run(ctx context.Context, d time.Duration) (n int, lat []time.Duration, err error) {
	sys, op, req, w, inflight := tl.sys, tl.op, tl.req, tl.w, tl.inflight
	var mu sync.Mutex
	var out sync.WaitGroup // the requests still out: waited for before run returns
	load := newAsyncLoad(inflight)
	rctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	until := time.Now().Add(d)
	var firstErr error
	load.run(rctx, func() error {
		if time.Now().After(until) {
			return errTuneDone
		}
		out.Add(1)
		go func() {
			defer out.Done()
			defer load.release()
			r := *req
			if r.InputPaths != nil {
				// Each answer's outputs in a directory of its own (an output is never
				// written over), removed once it is read. MkdirTemp names it: unique
				// across layouts, whatever a previous system left behind.
				dir, err := os.MkdirTemp(filepath.Join(w.dir, "spool"), "out-")
				r.OutputDir = dir
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
				defer os.RemoveAll(r.OutputDir)
			}
			t0 := time.Now()
			var rep map[string]any
			e := sys.cl.Do(rctx, op, &r, &rep)
			mu.Lock()
			defer mu.Unlock()
			if e != nil {
				if firstErr == nil {
					firstErr = e
				}
				return
			}
			if time.Now().Before(until) {
				n++
				lat = append(lat, time.Since(t0))
			}
		}()
		return nil
	})
	time.Sleep(time.Until(until))
	herr := load.halt()
	out.Wait() // bounded by rctx: no request of this run outlives it
	if herr != nil && herr != errTuneDone {
		return 0, nil, herr
	}
	// The answers still out come after until: not counted.
	mu.Lock()
	defer mu.Unlock()
	return n, slices.Clone(lat), firstErr
}

var errTuneDone = fmt.Errorf("tune: the measured time is over")

// zerosTensor is a float32 tensor of zeros of the shape spec (dimensions joined by x, e.g.
// 1x3x640x640): an input whose values do not change a network's cost.
func zerosTensor(spec string) (*codec.Tensor, error) {
	var shape []int64
	n := int64(1)
	for _, d := range strings.Split(spec, "x") {
		v, err := strconv.ParseInt(d, 10, 64)
		if err != nil || v < 0 || v > 1<<20 {
			return nil, fmt.Errorf("zeros:%s: want dimensions like 1x3x640x640", spec)
		}
		shape = append(shape, v)
		n *= v
		if n > 1<<28 {
			return nil, fmt.Errorf("zeros:%s: too large", spec)
		}
	}
	return &codec.Tensor{Type: "float32", Shape: shape, Data: make([]byte, 4*n)}, nil
}

// cpuTicks sums the user and system clock ticks of pids (/proc/PID/stat fields 14, 15).
func cpuTicks(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		proc, err := procfs.NewProc(pid)
		if err != nil {
			continue
		}
		if st, err := proc.Stat(); err == nil {
			sum += int64(st.UTime + st.STime)
		}
	}
	return sum
}
