package bench

// The system a scenario runs on: its gateway config (collisionConfig), how each class
// makes a request (scenarioRequests, the real models fetched), and its start with a
// warm-up of every class and chain (startScenario, warmUp).

import (
	"context"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// scenarioRequests fetches the real models the scenario loads (into w.fetched) and
// returns how each class makes a request (a stream class: a first frame, for the
// warm-up; its frames are made by its streams), and the by-path detector when a class
// uses it (its spool made).
func scenarioRequests(o *Options, sc *Scenario, w *workdir) ([]func() codec.Request, *ocrPath, error) {
	w.fetched = map[string]string{}
	for model, dir := range map[string]func() (string, error){"vad": o.vadDir, "ocr": o.ocrDir} {
		if sc.uses(model) {
			d, err := dir()
			if err != nil {
				return nil, nil, err
			}
			w.fetched[model] = d
		}
	}
	var ocr *ocrPath
	if sc.uses("ocr") {
		if err := os.MkdirAll(w.spool(), 0o755); err != nil {
			return nil, nil, err
		}
		var err error
		if ocr, err = newOCRPath(w, sc.ocrSide()); err != nil {
			return nil, nil, err
		}
	}
	reqs := make([]func() codec.Request, len(sc.Classes))
	colours := []color.RGBA{{R: 255, A: 255}, {G: 255, A: 255}, {B: 255, A: 255}}
	for i, c := range sc.Classes {
		timeout := c.Timeout.D().Milliseconds()
		switch c.Model {
		case "tiny":
			x := &codec.Tensor{Type: "float32", Shape: []int64{1, onnxgen.TinyDim}, Data: codec.Float32Bytes([]float32{1, 2, 3, 4})}
			reqs[i] = func() codec.Request {
				return codec.Request{Model: c.Model, Class: c.Name, Inputs: map[string]*codec.Tensor{"x": x}, TimeoutMS: timeout}
			}
		case "vad":
			frame := streamAudio(sc.Seed, 0, 1)
			reqs[i] = func() codec.Request {
				r := vadRequest(c.Model, c.Name, make([]float32, vadContext), frame, make([]float32, vadState))
				r.TimeoutMS = timeout
				return r
			}
		case "ocr":
			reqs[i] = func() codec.Request {
				r := ocr.request(c.Model)
				r.Class, r.TimeoutMS = c.Name, timeout
				return r
			}
		default: // tag: tagger, heavy
			p, err := w.solidPNG(c.Name, c.Image, colours[i%len(colours)])
			if err != nil {
				return nil, nil, err
			}
			reqs[i] = func() codec.Request {
				return codec.Request{Model: c.Model, Class: c.Name, Path: p, TimeoutMS: timeout}
			}
		}
	}
	return reqs, ocr, nil
}

// startScenario starts a system on cfg and warms it up.
func startScenario(ctx context.Context, o *Options, w *workdir, name, cfg string, sc *Scenario, reqs []func() codec.Request) (*system, error) {
	sys, err := startSystem(ctx, o, w, name, cfg)
	if err != nil {
		return nil, err
	}
	if err := warmUp(ctx, sys, sc, reqs); err != nil {
		sys.stop()
		return nil, err
	}
	clearDir(w.spool()) // the warm-up's detector outputs
	return sys, nil
}

// collisionConfig is the gateway config of a scenario (without its policy). A stream
// class's max_timeout is at least 30 s, for the warm-up (its frames carry their own
// timeout_ms, below its timeout).
func collisionConfig(sc *Scenario, w *workdir, lib string) sysConfig {
	c := sysConfig{Images: w.images}
	for _, p := range sc.Pools {
		c.Pools = append(c.Pools, poolSpec{Name: p.Name, Runtime: lib, Workers: p.Workers, Slots: p.Slots, Threads: p.Threads,
			EP: p.EP, Device: p.Device, Classes: p.Classes, Models: p.Models, MaxBatch: p.MaxBatch, MaxDelay: p.MaxDelay.D(), Nice: p.Nice, AdapterMismatch: p.AdapterMismatch})
	}
	for _, cl := range sc.Classes {
		var chain []string
		for _, p := range sc.Pools {
			if slices.Contains(p.Classes, cl.Name) {
				chain = append(chain, p.Name)
			}
		}
		maxTimeout := cl.Timeout.D()
		if cl.Arrival == "stream" {
			maxTimeout = max(maxTimeout, 30*time.Second)
		}
		c.Classes = append(c.Classes, classSpec{Name: cl.Name, Chain: chain, Timeout: cl.Timeout.D(), MaxTimeout: maxTimeout, QueueBound: cl.QueueBound, Degrade: cl.Degrade})
	}
	for name, b := range sc.Devices {
		if c.Devices == nil {
			c.Devices = map[string]config.Device{}
		}
		c.Devices[name] = config.Device{Capacity: b}
	}
	if t := sc.Tenant; t != nil && t.GateClass != "" {
		if c.Devices == nil {
			c.Devices = map[string]config.Device{}
		}
		d := c.Devices[t.Device]
		d.GateClass = t.GateClass
		c.Devices[t.Device] = d
	}
	dirs := map[string]modelSpec{
		"tiny":   {Name: "tiny", Kind: config.KindRaw, Dir: filepath.Join(w.models, onnxgen.TinyDir)},
		"tagger": {Name: "tagger", Kind: config.KindTaggerPixAI, Dir: filepath.Join(w.models, onnxgen.TaggerDir)},
		"heavy":  {Name: "heavy", Kind: config.KindTaggerPixAI, Dir: filepath.Join(w.models, onnxgen.TaggerHeavyDir)},
		"vad":    {Name: "vad", Kind: config.KindRaw, Dir: w.fetched["vad"]},
		"ocr":    {Name: "ocr", Kind: config.KindRaw, Dir: w.fetched["ocr"]},
	}
	used := map[string]bool{}
	for _, p := range sc.Pools {
		for _, m := range p.Models {
			used[m] = true
		}
	}
	for _, name := range []string{"tiny", "tagger", "heavy", "vad", "ocr"} {
		if used[name] {
			c.Models = append(c.Models, dirs[name])
		}
	}
	if used["ocr"] {
		c.Spool = w.spool()
	}
	return c
}

// Warm-ups per class (through its chain), and per pool of a chain of several pools.
const (
	classWarmups = 3
	// chainWarmups is what each pool of a chain of several gets, sent to it by name: the
	// gateway's service-time estimate of a pool (an average that keeps 7/8 of the last
	// one at each answer, gateway/capacity.go) is what sends a class to one pool of its
	// chain or the next, and a first run that pays a GPU EP's shader compilation (a
	// second or more on lavapipe, where the worker's load warm-up could not run the
	// model: Silero VAD refuses its synthetic inputs) would otherwise stay in it for the
	// whole bench: the class never tries that pool again. After 40 answers the first
	// one weighs (7/8)^40, under 0.5 %.
	chainWarmups = 40
)

// warmUp sends a few requests of each class, one at a time, so that no measured run pays
// for first runs: classWarmups through its chain, and chainWarmups to each pool of a
// chain of several pools.
func warmUp(ctx context.Context, sys *system, sc *Scenario, reqs []func() codec.Request) error {
	for i, c := range sc.Classes {
		pools := []string{""}
		n := classWarmups
		if chain := sc.chain(c.Name, c.Model); len(chain) > 1 {
			pools, n = chain, chainWarmups
		}
		for _, pool := range pools {
			for range n {
				req := reqs[i]()
				req.ID, req.Pool = nuid.Next(), pool
				req.TimeoutMS = max(req.TimeoutMS, 30_000)
				cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				err := sys.cl.Do(cctx, c.Op, &req, new(served))
				cancel()
				if err != nil && pool != "" {
					return fmt.Errorf("warm-up of %s on pool %s: %w", c.Name, pool, err)
				} else if err != nil {
					return fmt.Errorf("warm-up of %s: %w", c.Name, err)
				}
			}
		}
	}
	return nil
}
