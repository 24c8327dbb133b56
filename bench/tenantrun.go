package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/launch"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
)

// The LLM tenant in a bench run: Count processes, each
//
//	ortbus lease -s URL --device D --bytes SIZE --class C --holder llm-I
//	             [--gate --max-pause P --min-share S] -- ortbus bench llm-tenant ...
//
// (engine "onnx", the default: the generated decoder through ONNX Runtime), or, with
// engine "llama", the real engine: llama.cpp serving a generated GGUF file
// (tenants/llm/tenant.mjs through internal/llmtenant; llamatenant.go), whose wrapper also
// has --on-pressure 'kill -USR1 $ORTBUS_LEASE_PID' (the tenant then frees its model).
//
// started (and waited ready: the model loaded) before the run, told to begin at the run's
// start + the plan's start (a line on its stdin), and stopped at the window's end (its
// stdin closed: it stops at the next call, and a prompt cut off is not counted). Its
// prompt lines give the run's TenantStats.

// TenantPlan is a scenario's [tenant] table.
type TenantPlan struct {
	// Engine is "onnx" (the default: `ortbus bench llm-tenant`, the generated decoder) or
	// "llama" (llama.cpp: tenants/llm/tenant.mjs; llamatenant.go).
	Engine string `toml:"engine" json:"engine,omitempty"`
	// Model is the llama engine's generated GGUF model: a size of models/gguf (tiny,
	// bench); default tiny.
	Model string `toml:"model" json:"model,omitempty"`
	// GPU is the llama engine's backend (the tenant's -gpu): auto (the default: vulkan
	// where a GPU is found, else cpu), cpu, vulkan or cuda.
	GPU string `toml:"gpu" json:"gpu,omitempty"`
	// Context is the llama engine's context in tokens (default: prompt + tokens + 1,
	// at least 512).
	Context int `toml:"context" json:"context,omitempty"`
	// GateTarget is the class whose p95 with the gate the report holds to <= 1.5x its
	// solo p95 (default interactive).
	GateTarget string `toml:"gate_target" json:"gate_target,omitempty"`
	// Layers and Width are the onnx engine's decoder's (onnxgen.DefaultDecoder's when 0;
	// the MLP is 4 x Width).
	Layers int `toml:"layers" json:"layers"`
	Width  int `toml:"width" json:"width"`
	// Prompt is each prompt's tokens (the prefill), Tokens the tokens generated for it.
	Prompt int `toml:"prompt" json:"prompt"`
	Tokens int `toml:"tokens" json:"tokens"`
	// Threads are the tenant's ONNX Runtime intra-op threads (default 1).
	Threads int `toml:"threads" json:"threads"`
	// Count is how many tenant processes run (default 1; `bench capacity` steps it).
	Count int `toml:"count" json:"count"`
	// Device, Bytes and Class are its lease's (defaults cpu, 256 MiB, interactive).
	Device string       `toml:"device" json:"device"`
	Bytes  config.Bytes `toml:"bytes" json:"bytes"`
	Class  string       `toml:"class" json:"class"`
	// Gate adds a run with the lease's compute gate (`--gate --max-pause MaxPause
	// --min-share MinShare`: the tenant is paused while urgent work is queued or running
	// on the device) beside the runs without it.
	Gate     bool            `toml:"gate" json:"gate"`
	MaxPause config.Duration `toml:"max_pause" json:"max_pause,omitempty"`
	MinShare float64         `toml:"min_share" json:"min_share,omitempty"`
	// GateClass is the tenant's device's [devices.NAME] gate_class: the class whose work
	// (with every higher class's) pauses a gated tenant ("": the gateway's default,
	// urgent).
	GateClass string `toml:"gate_class" json:"gate_class,omitempty"`
	// PauseBy is the gated wrapper's --pause-by (auto, freezer or signal; "": its default).
	PauseBy string `toml:"pause_by" json:"pause_by,omitempty"`
	// Start is when the tenants begin after the run's start.
	Start config.Duration `toml:"start" json:"start,omitempty"`
}

func (p *TenantPlan) check() error {
	if p.Engine == "" {
		p.Engine = engineONNX
	}
	if p.GateTarget == "" {
		p.GateTarget = subjects.ClassInteractive
	}
	if !slices.Contains(stdClasses, p.GateTarget) {
		return fmt.Errorf("gate_target %q: want urgent, interactive or batch", p.GateTarget)
	}
	switch p.Engine {
	case engineONNX:
		if p.Model != "" || p.GPU != "" || p.Context != 0 {
			return fmt.Errorf("model, gpu and context are the llama engine's")
		}
		d := onnxgen.DefaultDecoder
		if p.Layers == 0 {
			p.Layers = d.Layers
		}
		if p.Width == 0 {
			p.Width = d.Width
		}
		if p.Prompt+p.Tokens > d.MaxPos {
			return fmt.Errorf("prompt + tokens must be <= %d", d.MaxPos)
		}
	case engineLlama:
		if err := p.checkLlama(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("engine %q: want onnx or llama", p.Engine)
	}
	if p.Threads == 0 {
		p.Threads = 1
	}
	if p.Count == 0 {
		p.Count = 1
	}
	if p.Device == "" {
		p.Device = "cpu"
	}
	if p.Bytes == 0 {
		p.Bytes = 256 << 20
	}
	if p.Class == "" {
		p.Class = subjects.ClassInteractive
	}
	if p.Gate && p.MaxPause == 0 {
		p.MaxPause = config.Duration(250 * time.Millisecond)
	}
	if p.Gate && p.MinShare == 0 {
		p.MinShare = 0.5
	}
	switch {
	case p.Layers < 0 || (p.Engine == engineONNX && p.Width <= 0) || p.Threads < 0 || p.Count < 0 || p.Bytes < 0 || p.Start < 0:
		return fmt.Errorf("layers, width, threads, count, bytes and start must not be negative")
	case p.Prompt <= 0 || p.Tokens <= 0:
		return fmt.Errorf("prompt and tokens must be > 0")
	case p.MaxPause < 0 || p.MinShare < 0 || p.MinShare > 1:
		return fmt.Errorf("max_pause must be >= 0 and min_share in [0, 1]")
	case p.PauseBy != "" && !slices.Contains([]string{"auto", "freezer", "signal"}, p.PauseBy):
		return fmt.Errorf("pause_by %q: want auto, freezer or signal", p.PauseBy)
	case p.GateClass != "" && !slices.Contains([]string{subjects.ClassUrgent, subjects.ClassInteractive, subjects.ClassBatch}, p.GateClass):
		return fmt.Errorf("gate_class %q: want urgent, interactive or batch", p.GateClass)
	}
	return nil
}

// spec is the decoder the plan runs.
func (p *TenantPlan) spec() onnxgen.DecoderSpec {
	s := onnxgen.DefaultDecoder
	s.Layers, s.Width, s.FF = p.Layers, p.Width, 4*p.Width
	return s
}

// TenantStats are the LLM tenants' figures in one run: the prompts they answered within
// the window, their first-token latency (from a prompt's start to its first generated
// token: the prefill of its long context) and their decode rate: tokens generated after
// the first over the time that took, summed over the tenants.
type TenantStats struct {
	Tenants         int     `json:"tenants"`
	Gated           bool    `json:"gated"`
	Prompts         int     `json:"prompts"`
	Tokens          int     `json:"tokens"`
	FirstTokenP50MS float64 `json:"first_token_p50_ms"`
	FirstTokenP95MS float64 `json:"first_token_p95_ms"`
	FirstTokenMaxMS float64 `json:"first_token_max_ms"`
	TokensPerS      float64 `json:"tokens_per_s"`
	// Pauses counts the gate's pauses of the tenants, from their wrappers' logs ("ortbus
	// lease: gate: paused #N"); 0 without the gate.
	Pauses int `json:"pauses"`
	// Engine is the llama engine's (llama.cpp and node-llama-cpp's version), Backend its
	// -gpu, Frees the frees its wrappers' on-pressure hooks asked for ("" and 0 for the
	// onnx engine).
	Engine  string `json:"engine,omitempty"`
	Backend string `json:"backend,omitempty"`
	Frees   int    `json:"frees"`
}

// tenantRun is how a run has its tenants: the plan, how many, gated or not, and what it
// starts them with.
type tenantRun struct {
	plan  *TenantPlan
	n     int
	gated bool
	// ortbus is the ortbus binary (the wrapper and the tenant), lib the runtime, model
	// the decoder's folder.
	ortbus, lib, model string
	logs               io.Writer // also receives the tenants' logs (Options.Logs)
	// llama is the llama engine's setup (nil: the onnx engine).
	llama *llamaEngine
}

// runningTenants are a run's started tenants, of either engine: begin tells them to
// start answering, finish stops them at the window's end and returns their figures, kill
// stops them at once (a failed start, a cancelled run; nothing after finish).
type runningTenants interface {
	begin()
	finish() (*TenantStats, error)
	kill()
}

// tenantSetup makes the plan's model in w (the onnx engine's decoder, the llama engine's
// GGUF file) and returns the run template (nil when the scenario has no tenant), and
// whether the ortbus binary's lease has --gate. gpu is the scenario's GPU (nil: it has
// none), for the llama engine's backend.
func tenantSetup(o *Options, w *workdir, lib string, sc *Scenario, gpu *GPUCollision) (*tenantRun, bool, error) {
	if sc.Tenant == nil {
		return nil, false, nil
	}
	bin := filepath.Join(o.BinDir, "ortbus")
	if !isFile(bin) {
		return nil, false, fmt.Errorf("bench: %s is missing (the tenant runs under `ortbus lease`): run `make build`", bin)
	}
	out, _ := exec.Command(bin, "lease", "-h").CombinedOutput()
	gate := strings.Contains(string(out), "-gate")
	t := &tenantRun{plan: sc.Tenant, n: sc.Tenant.Count, ortbus: bin, lib: lib, logs: o.Logs}
	if sc.Tenant.Engine == engineLlama {
		var err error
		t.llama, err = llamaSetup(o, w, sc.Tenant, gpu)
		return t, gate, err
	}
	t.model = filepath.Join(w.models, onnxgen.DecoderDir)
	if err := onnxgen.GenerateDecoder(t.model, sc.Tenant.spec()); err != nil {
		return nil, false, err
	}
	return t, gate, nil
}

// with is a copy of the template with n tenants, gated or not.
func (t *tenantRun) with(n int, gated bool) *tenantRun {
	if t == nil {
		return nil
	}
	c := *t
	c.n, c.gated = n, gated
	return &c
}

// gatePausedLine begins the line `ortbus lease --gate` logs at each pause of its process.
const gatePausedLine = "ortbus lease: gate: paused #"

// tenantProcs are a run's started tenants.
type tenantProcs struct {
	run    *tenantRun
	procs  []*launch.Proc
	stdins []*os.File // each one's stdin (the write end)
}

// start starts the tenants on the system whose bus is natsURL and waits for each one's
// ready line (the lease granted, the model loaded). window bounds their run.
func (t *tenantRun) start(ctx context.Context, natsURL string, window time.Duration) (runningTenants, error) {
	if t.llama != nil {
		return t.startLlama(ctx, natsURL)
	}
	tp := &tenantProcs{run: t}
	p := t.plan
	for i := range t.n {
		args := append(t.leaseArgs(natsURL, i), "--", t.ortbus, "bench", "llm-tenant", "-lib", t.lib, "-model", t.model, "-prompt", strconv.Itoa(p.Prompt),
			"-tokens", strconv.Itoa(p.Tokens), "-threads", strconv.Itoa(p.Threads), "-duration", (window + time.Second).String(), "-seed", strconv.Itoa(i+1))
		r, w, err := os.Pipe()
		if err != nil {
			tp.kill()
			return nil, err
		}
		proc, err := launch.Start(t.ortbus, args, launch.Options{Name: fmt.Sprint("llm tenant ", i), Stdin: r, Tee: t.logs})
		r.Close()
		if err != nil {
			w.Close()
			tp.kill()
			return nil, err
		}
		tp.procs, tp.stdins = append(tp.procs, proc), append(tp.stdins, w)
	}
	for _, proc := range tp.procs {
		if _, err := proc.Ready(ctx, startBound); err != nil {
			err = fmt.Errorf("%w; log tail:\n%s", err, proc.LogTail(20))
			tp.kill()
			return nil, err
		}
	}
	return tp, nil
}

// leaseArgs are tenant i's `ortbus lease` arguments (without the "--" and CMD): the
// plan's device, bytes and class, and the gate's flags when the run is gated.
func (t *tenantRun) leaseArgs(natsURL string, i int) []string {
	p := t.plan
	args := []string{"lease", "-s", natsURL, "--device", p.Device, "--bytes", strconv.FormatInt(int64(p.Bytes), 10), "--class", p.Class,
		"--holder", fmt.Sprint("llm-", i)}
	if t.gated {
		args = append(args, "--gate", "--max-pause", p.MaxPause.D().String(), "--min-share", strconv.FormatFloat(p.MinShare, 'g', -1, 64))
		if p.PauseBy != "" {
			args = append(args, "--pause-by", p.PauseBy)
		}
	}
	return args
}

// begin tells every tenant to start answering prompts.
func (tp *tenantProcs) begin() {
	for _, w := range tp.stdins {
		w.WriteString("go\n")
	}
}

// finish closes the tenants' stdin (they stop at their next call), waits for their exit
// and returns their figures.
func (tp *tenantProcs) finish() (*TenantStats, error) {
	for _, w := range tp.stdins {
		w.Close()
	}
	st := &TenantStats{Tenants: len(tp.procs), Gated: tp.run.gated}
	var firsts []time.Duration
	var problems []string
	for _, proc := range tp.procs {
		state, err := proc.Wait(stopBound)
		if err != nil {
			problems = append(problems, err.Error())
			proc.Stop(stopBound)
			continue
		}
		if !state.Success() {
			problems = append(problems, fmt.Sprintf("%s exited with %v; log tail:\n%s", "llm tenant", state, proc.LogTail(20)))
		}
		var decodeTokens int
		var decode time.Duration
		sc := bufio.NewScanner(strings.NewReader(proc.Log()))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), gatePausedLine) {
				st.Pauses++
				continue
			}
			var p TenantPrompt
			if json.Unmarshal(sc.Bytes(), &p) != nil || p.Event != "prompt" {
				continue
			}
			st.Prompts++
			st.Tokens += p.Tokens
			firsts = append(firsts, time.Duration(p.FirstTokenMS*float64(time.Millisecond)))
			decodeTokens += p.Tokens - 1
			decode += time.Duration(p.DecodeMS * float64(time.Millisecond))
		}
		if decode > 0 {
			st.TokensPerS += float64(decodeTokens) / decode.Seconds()
		}
	}
	st.settle(firsts)
	if len(problems) > 0 {
		return st, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return st, nil
}

// settle rounds the summed decode rate and sets the first-token percentiles of firsts,
// every engine's last step.
func (st *TenantStats) settle(firsts []time.Duration) {
	st.TokensPerS = round(st.TokensPerS, 2)
	s := summarize(firsts)
	st.FirstTokenP50MS, st.FirstTokenP95MS, st.FirstTokenMaxMS = ms(s.P50), ms(s.P95), ms(s.Max)
}

// kill stops every tenant at once (a failed start, a cancelled run).
func (tp *tenantProcs) kill() {
	for _, w := range tp.stdins {
		w.Close()
	}
	for _, proc := range tp.procs {
		proc.Stop(stopBound)
	}
}
