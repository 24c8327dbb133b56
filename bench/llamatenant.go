package bench

// The llama engine of the LLM tenant ([tenant] engine = "llama"): the real engine,
// llama.cpp through node-llama-cpp (tenants/llm/tenant.mjs, run by internal/llmtenant),
// serving a GGUF file generated here (models/gguf: tiny or bench). Each tenant process is
//
//	ortbus lease -s URL --device D --bytes SIZE --class C --holder llm-I
//	             [--gate --max-pause P --min-share S]
//	             --on-pressure 'kill -USR1 $ORTBUS_LEASE_PID' -- node tenant.mjs ...
//
// started before the run (the model loaded, one generation made and not counted: the
// first is cold, and on a GPU it compiles the backend's kernels), then asked for one
// generation after another — each a prompt of Prompt tokens (BOS and one token a byte),
// then Tokens generated, EOS masked so that each does the same work — from the run's
// start + the plan's start until the window's end; a generation cut off by the end is
// not counted. The tenant's request events give the run's TenantStats: first_token_ms
// (from the request's turn to its first token: the prompt's evaluation, the prefill) and
// the decode rate (tokens after the first over the time they took). A free that the
// gateway's pressure asks for (the on-pressure hook's SIGUSR1) is counted; the tenant
// then answers nothing more in that run (its generations are refused "unloaded"), as a
// tenant that gave its memory back.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ortbus/ortbus/internal/llmtenant"
	"github.com/ortbus/ortbus/models/gguf"
)

const (
	engineONNX  = "onnx"
	engineLlama = "llama"
	// onPressure is the llama tenant's wrapper's --on-pressure: SIGUSR1 to the tenant
	// (ORTBUS_LEASE_PID is CMD's pid), which frees its model and context.
	onPressure = "kill -USR1 $ORTBUS_LEASE_PID"
	// llamaStartBound bounds a llama tenant's start and its cold generation: minutes
	// where a Vulkan backend compiles its shaders on a first start.
	llamaStartBound = 5 * time.Minute
)

// checkLlama checks a llama plan and fills in its defaults (model tiny, gpu auto, the
// context).
func (p *TenantPlan) checkLlama() error {
	if p.Model == "" {
		p.Model = "tiny"
	}
	size, ok := gguf.Sizes[p.Model]
	if !ok {
		return fmt.Errorf("model %q: want one of %v", p.Model, gguf.SizeNames())
	}
	if p.GPU == "" {
		p.GPU = "auto"
	}
	if !slices.Contains([]string{"auto", "cpu", "vulkan", "cuda"}, p.GPU) {
		return fmt.Errorf("gpu %q: want auto, cpu, vulkan or cuda", p.GPU)
	}
	if p.Layers != 0 || p.Width != 0 {
		return fmt.Errorf("layers and width are the onnx engine's decoder's")
	}
	if p.Context == 0 {
		p.Context = max(512, p.Prompt+p.Tokens+1)
	}
	switch {
	case p.Prompt < 2 || p.Tokens > llmtenant.MaxTokens:
		return fmt.Errorf("prompt must be >= 2 tokens (BOS and a byte), tokens <= %d", llmtenant.MaxTokens)
	case p.Prompt+p.Tokens+1 > p.Context || p.Context > size.Context:
		return fmt.Errorf("prompt + tokens + 1 must fit the context (%d), and the context model %s's %d", p.Context, p.Model, size.Context)
	}
	return nil
}

// llamaEngine is a llama plan's setup: the tenant's options but its wrapper, its
// backend and why, and its request.
type llamaEngine struct {
	opts    llmtenant.Options
	why     string
	request llmtenant.Request
}

// llamaSetup checks that the tenant is installed, generates the plan's model into w and
// picks the backend (gpu: the scenario's GPU, nil when it has none).
func llamaSetup(o *Options, w *workdir, p *TenantPlan, gpu *GPUCollision) (*llamaEngine, error) {
	if why := llmtenant.Missing(o.Repo); why != "" {
		return nil, fmt.Errorf("bench: the llama tenant cannot run: %s", why)
	}
	model, err := gguf.GenerateLlama(filepath.Join(w.dir, "llm"), p.Model)
	if err != nil {
		return nil, err
	}
	backend, why := llamaBackend(p.GPU, gpu)
	return &llamaEngine{
		opts: llmtenant.Options{Script: llmtenant.Script(o.Repo), Modules: llmtenant.Modules(o.Repo), Model: model, GPU: backend,
			Threads: p.Threads, Context: p.Context},
		why:     why,
		request: llmtenant.Request{Prompt: llamaPrompt(p.Prompt), MaxTokens: p.Tokens},
	}, nil
}

// llamaBackend is the tenant's -gpu for the plan's gpu, and why. Policy for auto: the
// Vulkan backend where the machine has a GPU (node-llama-cpp's prebuilt Vulkan binary is
// what `make llm-tenant` installs beside the CPU one), else the CPU: on lavapipe the
// Vulkan backend's first token waits ~150 s for its shaders to compile, too slow for a
// smoke, and lavapipe is the CPU anyway.
func llamaBackend(plan string, gpu *GPUCollision) (backend, why string) {
	switch {
	case plan != "auto":
		return plan, "the scenario's [tenant] gpu"
	case gpu != nil && gpu.GPU.Device != "":
		return "vulkan", "a GPU is found (" + gpu.GPU.What + "): llama.cpp's Vulkan backend"
	}
	return "cpu", "no GPU: llama.cpp on the CPU (its Vulkan backend over lavapipe compiles shaders for ~150 s before a first token)"
}

// llamaPrompt is a prompt of n tokens: BOS, then n-1 bytes of text (the generated
// models' vocabulary is one token a byte).
func llamaPrompt(n int) string {
	const text = "The camera saw a red kite over the harbour while the radio read the tide tables aloud. "
	return strings.Repeat(text, (n-1)/len(text)+1)[:n-1]
}

// llamaProcs are a run's started llama tenants (runningTenants).
type llamaProcs struct {
	run     *tenantRun
	tenants []*llmtenant.Tenant
	logs    []*gateLog // each wrapper's stderr, where its pauses are counted
	frees   atomic.Int64
	// ctx ends the generations (finish, kill); gen waits for their loops.
	ctx    context.Context
	cancel context.CancelFunc
	gen    sync.WaitGroup
	mu     sync.Mutex
	events [][]llmtenant.Event // each tenant's counted generations
	errs   []string
}

// startLlama starts the run's llama tenants under their wrappers and makes each one's
// cold generation.
func (t *tenantRun) startLlama(ctx context.Context, natsURL string) (runningTenants, error) {
	lp := &llamaProcs{run: t, events: make([][]llmtenant.Event, t.n)}
	lp.ctx, lp.cancel = context.WithCancel(context.Background())
	for i := range t.n {
		o := t.llama.opts
		o.Wrap = append(append([]string{t.ortbus}, t.leaseArgs(natsURL, i)...), "--on-pressure", onPressure, "--")
		gl := &gateLog{tee: t.logs}
		o.Stderr = gl
		o.OnEvent = func(ev llmtenant.Event) {
			if ev.Event == llmtenant.EventFreed {
				lp.frees.Add(1)
			}
		}
		sctx, cancel := context.WithTimeout(ctx, llamaStartBound)
		tn, err := llmtenant.Start(sctx, o)
		if err == nil {
			lp.tenants, lp.logs = append(lp.tenants, tn), append(lp.logs, gl)
			_, err = tn.Generate(sctx, t.llama.request)
		}
		cancel()
		if err != nil {
			lp.kill()
			return nil, fmt.Errorf("llama tenant %d: %w", i, err)
		}
	}
	return lp, nil
}

// begin starts each tenant's generations, one after another until finish.
func (lp *llamaProcs) begin() {
	for i, tn := range lp.tenants {
		lp.gen.Go(func() { lp.generate(i, tn) })
	}
}

// generate is tenant i's loop: a generation at a time, each counted when it came back
// whole before the end.
func (lp *llamaProcs) generate(i int, tn *llmtenant.Tenant) {
	for lp.ctx.Err() == nil {
		ev, err := tn.Generate(lp.ctx, lp.run.llama.request)
		if lp.ctx.Err() != nil {
			return // cut off by the end: not counted
		}
		var te *llmtenant.Error
		switch {
		case errors.As(err, &te) && te.Code == llmtenant.CodeUnloaded, err == nil && ev.Stop == llmtenant.StopFreed:
			return // freed by the on-pressure hook (counted in frees): nothing more this run
		case err != nil:
			lp.fail(fmt.Sprintf("llama tenant %d: %v", i, err))
			return
		}
		lp.mu.Lock()
		lp.events[i] = append(lp.events[i], ev)
		lp.mu.Unlock()
	}
}

func (lp *llamaProcs) fail(what string) {
	lp.mu.Lock()
	lp.errs = append(lp.errs, what)
	lp.mu.Unlock()
}

// finish ends the generations, stops the tenants (each exits once its generation in
// hand is done, and its wrapper releases the lease) and returns their figures.
func (lp *llamaProcs) finish() (*TenantStats, error) {
	lp.cancel()
	lp.gen.Wait()
	for i, tn := range lp.tenants {
		ctx, cancel := context.WithTimeout(context.Background(), stopBound)
		if _, err := tn.Stop(ctx); err != nil {
			lp.fail(fmt.Sprintf("llama tenant %d: %v", i, err))
		}
		cancel()
	}
	e := lp.run.llama
	st := &TenantStats{Tenants: len(lp.tenants), Gated: lp.run.gated, Engine: "llama.cpp (node-llama-cpp " + lp.version() + ")", Backend: e.opts.GPU,
		Frees: int(lp.frees.Load())}
	var firsts []time.Duration
	for i := range lp.tenants {
		st.Pauses += lp.logs[i].pauses()
		var decodeTokens int
		var decode float64 // seconds
		for _, ev := range lp.events[i] {
			st.Prompts++
			st.Tokens += ev.Tokens
			firsts = append(firsts, time.Duration(ev.FirstTokenMS*float64(time.Millisecond)))
			if ev.Tokens > 1 && ev.TokensPerS > 0 {
				decodeTokens += ev.Tokens - 1
				decode += float64(ev.Tokens-1) / ev.TokensPerS
			}
		}
		if decode > 0 {
			st.TokensPerS += float64(decodeTokens) / decode
		}
	}
	st.settle(firsts)
	if len(lp.errs) > 0 {
		return st, errors.New(strings.Join(lp.errs, "; "))
	}
	return st, nil
}

// version is node-llama-cpp's version, from the first tenant's ready event.
func (lp *llamaProcs) version() string {
	if len(lp.tenants) == 0 {
		return "?"
	}
	return lp.tenants[0].Ready().NodeLlamaCpp
}

// kill stops every tenant at once.
func (lp *llamaProcs) kill() {
	lp.cancel()
	for _, tn := range lp.tenants {
		tn.Close()
	}
	lp.gen.Wait()
}

// gateLog is a wrapper's stderr: it counts the lines of the gate's pauses
// (gatePausedLine) and copies everything to tee (nil: nowhere).
type gateLog struct {
	mu      sync.Mutex
	partial []byte
	n       int
	tee     io.Writer
}

func (g *gateLog) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.tee != nil {
		g.tee.Write(p)
	}
	g.partial = append(g.partial, p...)
	for {
		i := bytes.IndexByte(g.partial, '\n')
		if i < 0 {
			break
		}
		if bytes.HasPrefix(g.partial[:i], []byte(gatePausedLine)) {
			g.n++
		}
		g.partial = g.partial[i+1:]
	}
	if len(g.partial) > 4096 { // no line of the wrapper's is this long: drop it
		g.partial = g.partial[:0]
	}
	return len(p), nil
}

func (g *gateLog) pauses() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}
