package bench

// throughput -ep webgpu: the same bench on ONNX Runtime's WebGPU EP (Dawn over Vulkan on
// Linux) for its three kinds of path side by side — the system's pools (ep = "webgpu" on
// the device, strict: no fallback), the in-process loop (ort.Provider webgpu, strict) and
// onnxruntime-node (executionProviders: ['webgpu']) — each checked to run on webgpu as it
// runs, each paying its shader compilation before anything is counted.
//
// Without a GPU (findGPU) it says so and runs the smoke instead: the tiny model, one
// short round, on whatever Vulkan device there is (lavapipe on a CPU), marked "lavapipe
// smoke: not a GPU figure".

import (
	"context"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices/vulkan"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
)

// The webgpu smoke's settings.
const (
	// SmokeLabel marks the smoke's rows and report when it runs without a GPU.
	SmokeLabel = "lavapipe smoke: not a GPU figure"
	// smokeModel is the smoke's one model: onnxgen's tiny (x*2+1 on [1,4]), whose shaders
	// compile in a fraction of a second even on lavapipe.
	smokeModel = "tiny"
	// smokeDuration is the smoke's measured time per path (-duration overrides it);
	// smokeRounds its rounds; smokeWarm its warm-up (as throughputWarm).
	smokeDuration = time.Second
	smokeRounds   = 1
	smokeWarm     = 600 * time.Millisecond
)

// WebGPUSetup is how a throughput -ep webgpu run found the machine and what each path used.
type WebGPUSetup struct {
	// GPU is what the machine's GPU check (findGPU) found.
	GPU GPU `json:"gpu"`
	// Device is the system pools' device; Adapter the Vulkan device Dawn takes: the first
	// of Vulkan's adapters (as this process's loader lists them: the same loader and
	// drivers as every path's) in the order Dawn ranks them for ONNX Runtime's
	// high-performance request (discrete, integrated, CPU, other; vulkan.Report.Picked).
	Device  string         `json:"device"`
	Adapter string         `json:"adapter"`
	Vulkan  *vulkan.Report `json:"vulkan"`
	// Smoke, when set, marks a smoke run (SmokeLabel without a GPU): no target is judged.
	Smoke string `json:"smoke,omitempty"`
	// Paths are, for each path (inprocess, system, system_batched, node), the EP it ran
	// on as observed, its device and adapter, and its first run's cost by model.
	Paths map[string]*PathEP `json:"paths"`
	// MemoryCheck is, on a GPU, the system's workers' device_bytes against the device's
	// own growth once they were loaded (memcheck.go).
	MemoryCheck *MemCheck `json:"memory_check,omitempty"`
}

// PathEP is what one path ran on.
type PathEP struct {
	// EP is the execution provider observed (How says how); Where the process it ran in;
	// Device the system pools' device (the others name none); Adapter the Vulkan device
	// Dawn takes there (the same loader and drivers in every process of the run).
	EP      string `json:"ep"`
	Where   string `json:"where"`
	Device  string `json:"device,omitempty"`
	Adapter string `json:"adapter"`
	How     string `json:"how"`
	// FirstMS is, by model, the first run's time, paid before the warm-up (the EP's shader
	// compilation): in process and on node (its first process) the first call; through
	// the system the workers' load_ms (loading and warm-up runs at batch 1 and max_batch).
	FirstMS map[string]float64 `json:"first_ms"`
	// NodesByEP is, by model, where its nodes ran in the workers' warm-up (their
	// heartbeats' nodes_by_ep, from ONNX Runtime's profiler): the system paths only.
	NodesByEP map[string]map[string]int `json:"nodes_by_ep,omitempty"`
}

// webgpuRun is a throughput run's webgpu state (nil for cpu).
type webgpuRun struct {
	setup   *WebGPUSetup
	restore func()
}

// prepareWebGPU checks the machine for a GPU and for Vulkan, picks the pools' device and
// whether this is a smoke run, and sets the environment Dawn wants.
func prepareWebGPU(ctx context.Context, h *harness) (*webgpuRun, error) {
	o := h.o
	s := &WebGPUSetup{GPU: detectGPU(), Paths: map[string]*PathEP{}}
	vr, pick, err := probeAdapter(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench throughput -ep webgpu: %w", err)
	}
	s.Vulkan, s.Adapter = vr, pick.String()
	if err := s.GPU.checkAdapter(pick); err != nil {
		return nil, fmt.Errorf("bench throughput -ep webgpu: %w", err)
	}
	switch {
	case s.GPU.Device == "":
		s.Smoke, s.Device = SmokeLabel, "cpu"
		if o.Device != "" && o.Device != "cpu" {
			h.rep.note("-device %s not used: %s", o.Device, s.GPU.What)
		}
	case o.Smoke:
		s.Smoke, s.Device = "webgpu smoke (-smoke): the tiny model, short phases, not a figure of record", orDefault(o.Device, s.GPU.Device)
	default:
		s.Device = orDefault(o.Device, s.GPU.Device)
	}
	if s.Smoke != "" {
		h.rep.note("%s (%s; adapter %s)", s.Smoke, s.GPU.What, s.Adapter)
	}
	restore, err := webgpuEnv(h.w.dir)
	if err != nil {
		return nil, err
	}
	return &webgpuRun{setup: s, restore: restore}, nil
}

// smokeModels is the smoke's model: tiny, by infer, its input inline.
func smokeModels(h *harness) []tpModel {
	x := &codec.Tensor{Type: "float32", Shape: []int64{1, onnxgen.TinyDim}, Data: codec.Float32Bytes([]float32{0.5, -1, 2, 0})}
	return []tpModel{{name: smokeModel, kind: config.KindRaw, op: subjects.OpInfer, dir: filepath.Join(h.w.models, onnxgen.TinyDir), threads: 1,
		input:  fmt.Sprintf("x float32 [1,%d], inline", onnxgen.TinyDim),
		source: "onnxgen tiny (y = 2x+1)",
		req: func() codec.Request {
			return codec.Request{Model: smokeModel, Inputs: map[string]*codec.Tensor{"x": x}}
		},
		node: []nodeInput{{"x", x}}, nodeInput: nodeTensorInput}}
}

// path is the record of one path, made on first use.
func (s *WebGPUSetup) path(key, where, device, how string) *PathEP {
	p := s.Paths[key]
	if p == nil {
		p = &PathEP{Where: where, Device: device, Adapter: s.Adapter, How: how, FirstMS: map[string]float64{}}
		s.Paths[key] = p
	}
	return p
}

// observe records that path key ran model on ep; an EP other than want fails the bench
// (its figures would be another EP's).
func (s *WebGPUSetup) observe(key, model, ep, want string) error {
	p := s.Paths[key]
	if ep != want {
		return fmt.Errorf("%s path of %s ran on ep %q, not %s (%s)", key, model, ep, want, p.How)
	}
	p.EP = ep
	return nil
}

// checkWorkers checks that every worker of the system's pools runs on ep and device, as
// their heartbeats say, and records each path's load_ms of model.
func (s *WebGPUSetup) checkWorkers(ctx context.Context, sys *system, m tpModel, pools map[string]string, ep string) error {
	st, err := sys.status(ctx)
	if err != nil {
		return err
	}
	for key, pool := range pools {
		p := s.path(key, "the worker(s) of pool "+pool, s.Device, "every counted reply's ep, and the pool's workers' heartbeats (ep, device)")
		n := 0
		for _, w := range st.Workers {
			if w.Pool != pool {
				continue
			}
			n++
			if w.EP != ep || w.Device != s.Device {
				return fmt.Errorf("worker %s of pool %s runs ep %q on device %q, not %s on %s", w.Worker, pool, w.EP, w.Device, ep, s.Device)
			}
			for _, ms := range w.Models {
				if ms.Name == m.name {
					p.FirstMS[m.name] = max(p.FirstMS[m.name], float64(ms.LoadMS))
					if len(ms.NodesByEP) > 0 {
						if p.NodesByEP == nil {
							p.NodesByEP = map[string]map[string]int{}
						}
						p.NodesByEP[m.name] = ms.NodesByEP
					}
				}
			}
		}
		if n == 0 {
			return fmt.Errorf("pool %s: no worker in the gateway's status", pool)
		}
	}
	return nil
}

// warmBatches sends, for k = 1..maxBatch, k requests at once to pool and waits for them,
// so that the batched pool's worker runs (and its EP compiles the shaders of) each batch
// size before anything is measured; the plain pool (maxBatch 1) gets one request.
func warmBatches(ctx context.Context, sys *system, m tpModel, pool string, maxBatch int) error {
	for k := 1; k <= maxBatch; k++ {
		var wg sync.WaitGroup
		errs := make([]error, k)
		for i := range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = sendOne(ctx, sys, m, pool)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return fmt.Errorf("warm-up burst of %d on pool %s: %w", k, pool, err)
			}
		}
	}
	return nil
}

// sendOne sends one batch-class request of m to pool and waits for its reply (and does
// m.after with it); it returns who served it.
func sendOne(ctx context.Context, sys *system, m tpModel, pool string) (codec.Served, error) {
	req := m.req()
	req.ID, req.Class, req.Pool, req.TimeoutMS = nuid.Next(), subjects.ClassBatch, pool, 600_000
	if m.op == subjects.OpTag {
		r, err := sys.cl.Tag(ctx, req)
		if err != nil {
			return codec.Served{}, err
		}
		return r.Served, nil
	}
	r, err := sys.cl.Infer(ctx, req)
	if err != nil {
		return codec.Served{}, err
	}
	if m.after != nil {
		err = m.after(r)
	}
	return r.Served, err
}

// printWebGPU prints how a webgpu run ran: the GPU check, the adapter, each path's EP.
func (s *WebGPUSetup) print(out io.Writer, res *ThroughputResults) {
	if s.GPU.Device == "" {
		fmt.Fprintf(out, "webgpu: no GPU on this machine (%s): %s, on the Vulkan device there is\n", s.GPU.What, SmokeLabel)
	} else {
		fmt.Fprintf(out, "webgpu: GPU %s\n", s.GPU.What)
	}
	if s.Smoke != "" {
		fmt.Fprintf(out, "SMOKE (%s): model %s, %d round(s) of %.2gs per path, warm-up %v: a check that every path runs on webgpu; no target judged\n",
			s.Smoke, smokeModel, res.Setup.Rounds, res.Setup.PhaseS/float64(max(res.Setup.Rounds, 1)), time.Duration(res.Setup.WarmupS*2*float64(time.Second)))
	}
	var devs []string
	if s.Vulkan != nil {
		for _, d := range s.Vulkan.Adapters {
			devs = append(devs, d.String())
		}
	}
	fmt.Fprintf(out, "adapter: %s — the Vulkan device Dawn's high-performance request takes, of: %s\n", s.Adapter, strings.Join(devs, "; "))
	var rows []string
	for _, key := range []string{"inprocess", "system", "system_batched", "node"} {
		p := s.Paths[key]
		if p == nil {
			continue
		}
		var first []string
		for _, m := range slices.Sorted(maps.Keys(p.FirstMS)) {
			first = append(first, fmt.Sprintf("%s %.0f", m, p.FirstMS[m]))
		}
		var nodes []string
		for _, m := range slices.Sorted(maps.Keys(p.NodesByEP)) {
			var eps []string
			for _, ep := range slices.Sorted(maps.Keys(p.NodesByEP[m])) {
				eps = append(eps, fmt.Sprintf("%s:%d", ep, p.NodesByEP[m][ep]))
			}
			nodes = append(nodes, m+" "+strings.Join(eps, ","))
		}
		rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t", key, p.EP, p.Where, orDefault(p.Device, "-"), strings.Join(first, ", "), orDefault(strings.Join(nodes, "; "), "-"), p.How))
	}
	printTable(out, "path\tep\tprocess\tdevice\tfirst run ms\tnodes by ep\tep observed by\t", rows...)
}
