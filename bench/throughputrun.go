package bench

// Measuring one throughput model: its rounds over the three paths (the system, the
// runtime in process, onnxruntime-node) and the loops that count each path's items.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/ort"
)

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
