package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/ortbus/ortbus/config"
)

// CapacityResults are the results of `bench capacity`: under a constant batch flood, the
// load of the higher classes (the stream class's audio streams, the Poisson class's rate)
// raised step by step, each step run under the sharing policy and under FIFO, until some
// class misses its target (the knee), and a few steps more (after_knee).
type CapacityResults struct {
	Scenario *Scenario `json:"scenario"`
	// Seed is the seed of every step's arrivals and audio (the same in every run).
	Seed uint64 `json:"seed"`
	// StepWindowS is each step's arrival window.
	StepWindowS float64 `json:"step_window_s"`
	// Targets are the classes' targets (classes with a target only).
	Targets map[string]CapacityTarget `json:"targets"`
	Steps   []*CapacityStep           `json:"steps"`
	// Knee is the knee of each run ("policy", "fifo").
	Knee map[string]*CapacityKnee `json:"knee"`
	// PolicyKey says whether the gateway took `[gateway] policy` ("ok"), or why not (no
	// FIFO runs then).
	PolicyKey string `json:"policy_key"`
}

// CapacityTarget is a class's target: p95 at most P95MS, and at most MaxMissed of its
// requests missed (deadline misses, dropped frames, errors, unanswered).
type CapacityTarget struct {
	P95MS     float64 `json:"p95_ms"`
	MaxMissed float64 `json:"max_missed"`
}

// CapacityStep is one load step and its runs (nil: not run, past the run's knee).
type CapacityStep struct {
	Step    int     `json:"step"` // 1-based
	Streams int     `json:"streams"`
	Rate    float64 `json:"rate"`
	// Tenants is the step's LLM tenant processes (the [capacity] tenants; 0 without).
	Tenants int `json:"tenants"`
	// Policy and FIFO are the step's runs: each class's statistics and drain_ms.
	Policy *CollisionRun `json:"policy"`
	FIFO   *CollisionRun `json:"fifo"`
	// Missed lists, per run, each target missed at this step ("class: why").
	Missed map[string][]string `json:"missed"`
}

// CapacityKnee is where a run first missed a target.
type CapacityKnee struct {
	// Step is the first step (1-based) where some class missed its target; 0 when every
	// step run met every target.
	Step    int     `json:"step"`
	Streams int     `json:"streams,omitempty"`
	Rate    float64 `json:"rate,omitempty"`
	// Missed are the targets missed there.
	Missed []string `json:"missed,omitempty"`
	// LastMet is the last step before the knee (0: none; every step when there is no
	// knee), with its load: the highest load that met every target.
	LastMet        int     `json:"last_met_step"`
	LastMetStreams int     `json:"last_met_streams,omitempty"`
	LastMetRate    float64 `json:"last_met_rate,omitempty"`
}

// hasTarget reports whether a class has a capacity target: every class but the flood
// (and a batch burst), which is the constant load.
func hasTarget(c ScenarioClass) bool { return c.Arrival != "flood" && c.Arrival != "burst" }

// target is a class's target, its defaults filled in.
func target(c ScenarioClass) CapacityTarget {
	t := CapacityTarget{P95MS: ms(c.Timeout.D()), MaxMissed: 0.01}
	if c.TargetP95 > 0 {
		t.P95MS = ms(c.TargetP95.D())
	}
	if c.MaxMissed > 0 {
		t.MaxMissed = c.MaxMissed
	}
	return t
}

// missed counts a class's requests that missed: deadline misses (dropped frames
// included), errors other than those, and the unanswered.
func missed(s *ClassStats) int {
	n := s.DeadlineMisses + s.Unanswered
	for code, k := range s.Errors {
		if code != "deadline_exceeded" && code != codeSkipped {
			n += k
		}
	}
	return n
}

// targetMisses lists the targets a run missed ("class: why"), in class order; a class
// with a target but no statistics missed (it served nothing).
func targetMisses(sc *Scenario, classes map[string]*ClassStats) []string {
	var out []string
	for _, c := range sc.Classes {
		if !hasTarget(c) {
			continue
		}
		t := target(c)
		s := classes[c.Name]
		if s == nil || s.Count == 0 {
			out = append(out, c.Name+": no requests answered")
			continue
		}
		if s.P95MS > t.P95MS {
			out = append(out, fmt.Sprintf("%s: p95 %.1f ms > %.1f ms", c.Name, s.P95MS, t.P95MS))
		}
		if f := float64(missed(s)) / float64(s.Count); f > t.MaxMissed {
			what := "missed"
			if s.Stream != nil {
				what = "frames dropped"
			}
			out = append(out, fmt.Sprintf("%s: %d of %d %s (%.1f%% > %.1f%%)", c.Name, missed(s), s.Count, what, 100*f, 100*t.MaxMissed))
		}
	}
	return out
}

// kneeOf is the knee of a run's steps (missed[i]: the targets missed at step i; nil
// entries are steps not run, which end the run).
func kneeOf(steps []*CapacityStep, missed [][]string, ran []bool) *CapacityKnee {
	k := &CapacityKnee{}
	for i, s := range steps {
		if !ran[i] {
			break
		}
		if len(missed[i]) > 0 {
			k.Step, k.Streams, k.Rate, k.Missed = s.Step, s.Streams, s.Rate, missed[i]
			return k
		}
		k.LastMet, k.LastMetStreams, k.LastMetRate = s.Step, s.Streams, s.Rate
	}
	return k
}

// ParseSteps reads a step list "STREAMS:RATE[:TENANTS],...", e.g. "1:0.5,2:1,4:2" or
// "2:1:0,2:1:1,2:1:2" (TENANTS: LLM tenant processes; tenants is nil when no step names
// them, else each step's count, 0 where a step does not name it).
func ParseSteps(s string) (streams []int, rates []float64, tenants []int, err error) {
	named := false
	for _, part := range strings.Split(s, ",") {
		fields := strings.Split(strings.TrimSpace(part), ":")
		var n, k int
		var r float64
		var err1, err2, err3 error
		if len(fields) >= 2 {
			n, err1 = strconv.Atoi(fields[0])
			r, err2 = strconv.ParseFloat(fields[1], 64)
		}
		if len(fields) == 3 {
			k, err3 = strconv.Atoi(fields[2])
			named = true
		}
		if len(fields) < 2 || len(fields) > 3 || err1 != nil || err2 != nil || err3 != nil || n <= 0 || r <= 0 || k < 0 {
			return nil, nil, nil, fmt.Errorf("steps: %q is not STREAMS:RATE[:TENANTS] (a count > 0, a rate > 0, a count >= 0)", part)
		}
		streams, rates, tenants = append(streams, n), append(rates, r), append(tenants, k)
	}
	if !named {
		tenants = nil
	}
	return streams, rates, tenants, nil
}

// tenantsAt is step i's count of LLM tenants.
func (p *CapacityPlan) tenantsAt(i int) int {
	if i < len(p.Tenants) {
		return p.Tenants[i]
	}
	return 0
}

// withLoad is a copy of the scenario with step i's load: its streams in the stream
// class, its rate in the Poisson class, the step window.
func (s *Scenario) withLoad(i int) *Scenario {
	c := *s
	c.Classes = slices.Clone(s.Classes)
	c.Classes[s.classBy("stream")].Streams = s.Capacity.Streams[i]
	c.Classes[s.classBy("poisson")].Rate = s.Capacity.Rates[i]
	if s.Capacity.Window > 0 {
		c.Window = s.Capacity.Window
	}
	return &c
}

// Capacity runs the capacity curve (see CapacityResults).
func Capacity(ctx context.Context, o Options) (*Report, error) {
	h, sc, err := scenarioHarness(&o, "capacity", "capacity", capacityAdjust(&o))
	if err != nil {
		return nil, err
	}
	defer h.close()
	rep := h.rep
	res := newCapacityResults(sc)
	rep.Results = res
	setup, err := h.scenarioSetup(ctx, sc, &res.PolicyKey, "the policy runs used its built-in policy, and there are no FIFO runs")
	if err != nil {
		return nil, err
	}
	out := o.out()
	printCapacityPlan(out, sc, res)
	gatePolicy := capacityGate(out, rep, sc, setup)
	runAll := func(name, cfg string, set func(*CapacityStep, *CollisionRun)) error {
		sys, err := h.startScenario(ctx, name, cfg, sc, setup)
		if err != nil {
			return err
		}
		defer sys.stop()
		sys.runtimes(ctx, &rep.Machine.Runtimes)
		missedAt := make([][]string, len(res.Steps))
		ran := make([]bool, len(res.Steps))
		knee := -1
		for i, st := range res.Steps {
			if knee >= 0 && sc.Capacity.AfterKnee >= 0 && i > knee+sc.Capacity.AfterKnee {
				break
			}
			step := sc.withLoad(i)
			run, err := runSchedule(ctx, sys, step, step.Schedule(), setup.reqs, nil, setup.tenant.with(st.Tenants, gatePolicy && name == "policy"))
			if err != nil {
				return fmt.Errorf("%s run, step %d: %w", name, st.Step, err)
			}
			if setup.ocr != nil {
				if _, err := setup.ocr.checkSpool(); err != nil {
					rep.note("%s run, step %d: a detector output file is wrong: %v", name, st.Step, err)
				}
			}
			set(st, run)
			ran[i], missedAt[i] = true, targetMisses(sc, run.Classes)
			st.Missed[name] = append([]string{}, missedAt[i]...) // [] when every target was met
			if knee < 0 && len(missedAt[i]) > 0 {
				knee = i
			}
			fmt.Fprintf(out, "  %s step %d (%s): %s\n", name, st.Step, st.load(), verdictLine(missedAt[i]))
		}
		res.Knee[name] = kneeOf(res.Steps, missedAt, ran)
		return nil
	}
	if err := runAll("policy", setup.policyCfg, func(s *CapacityStep, r *CollisionRun) { s.Policy = r }); err != nil {
		return nil, err
	}
	if res.PolicyKey == "ok" {
		if err := runAll("fifo", setup.fifoCfg, func(s *CapacityStep, r *CollisionRun) { s.FIFO = r }); err != nil {
			return nil, err
		}
	}
	res.print(out, rep)
	if o.Chart != "" {
		if err := writeCapacityChart(o.Chart, res); err != nil {
			return nil, fmt.Errorf("chart: %w", err)
		}
	}
	return rep, nil
}

// capacityAdjust applies the options to the capacity scenario: -steps (TENANTS only with
// a [tenant] table) and -duration (a step's window).
func capacityAdjust(o *Options) func(sc *Scenario) error {
	return func(sc *Scenario) error {
		if sc.Capacity == nil {
			return fmt.Errorf("scenario %s has no [capacity] table (the load steps)", sc.Name)
		}
		if o.Steps != "" {
			var err error
			if sc.Capacity.Streams, sc.Capacity.Rates, sc.Capacity.Tenants, err = ParseSteps(o.Steps); err != nil {
				return err
			}
			if len(sc.Capacity.Tenants) > 0 && sc.Tenant == nil {
				return fmt.Errorf("steps: TENANTS needs a scenario with a [tenant] table (e.g. -scenario capacity-llm)")
			}
		}
		if o.Duration > 0 {
			sc.Capacity.Window = config.Duration(o.Duration)
		}
		return nil
	}
}

// newCapacityResults are the capacity curve's results before its runs: the classes'
// targets and the load steps.
func newCapacityResults(sc *Scenario) *CapacityResults {
	res := &CapacityResults{Scenario: sc, Seed: sc.Seed, StepWindowS: sc.withLoad(0).Window.D().Seconds(), Targets: map[string]CapacityTarget{},
		Knee: map[string]*CapacityKnee{}, PolicyKey: "ok"}
	for _, c := range sc.Classes {
		if hasTarget(c) {
			res.Targets[c.Name] = target(c)
		}
	}
	for i := range sc.Capacity.Streams {
		res.Steps = append(res.Steps, &CapacityStep{Step: i + 1, Streams: sc.Capacity.Streams[i], Rate: sc.Capacity.Rates[i], Tenants: sc.Capacity.tenantsAt(i),
			Missed: map[string][]string{}})
	}
	return res
}

// printCapacityPlan says the curve's steps and targets on out.
func printCapacityPlan(out io.Writer, sc *Scenario, res *CapacityResults) {
	var targets []string
	for _, c := range sc.Classes {
		if t, ok := res.Targets[c.Name]; ok {
			targets = append(targets, fmt.Sprintf("%s p95 <= %.0f ms and <= %.1f%% missed", c.Name, t.P95MS, 100*t.MaxMissed))
		}
	}
	unit := "streams:rate"
	if len(sc.Capacity.Tenants) > 0 {
		unit = "streams:rate:llm tenants"
	}
	fmt.Fprintf(out, "capacity: scenario %s, seed %d, %d steps of %v (%s %s), after the knee %d more; targets: %s\n",
		sc.Name, sc.Seed, len(res.Steps), sc.withLoad(0).Window.D(), unit, stepsLine(res.Steps), sc.Capacity.AfterKnee, strings.Join(targets, "; "))
}

// capacityGate is whether the policy runs' LLM tenants are gated, said on out.
// The LLM tenants of a step run without the gate under FIFO, and with it under the
// policy when the scenario asks for it and the ortbus binary's lease has it.
func capacityGate(out io.Writer, rep *Report, sc *Scenario, setup *scenarioSetup) bool {
	t := setup.tenant
	if t == nil || len(sc.Capacity.Tenants) == 0 {
		return false
	}
	spec := sc.Tenant.spec()
	gatePolicy := sc.Tenant.Gate && setup.gate
	fmt.Fprintf(out, "llm tenants per step: %v (decoder of %d layers, width %d; prompts of %d tokens then %d; lease on %s, class %s; gated under the policy: %v)\n",
		sc.Capacity.Tenants, spec.Layers, spec.Width, sc.Tenant.Prompt, sc.Tenant.Tokens, sc.Tenant.Device, sc.Tenant.Class, gatePolicy)
	if sc.Tenant.Gate && !setup.gate {
		rep.note("the policy runs' tenants are not gated: %s lease has no --gate", t.ortbus)
	}
	return gatePolicy
}

func stepsLine(steps []*CapacityStep) string {
	tenants := slices.ContainsFunc(steps, func(s *CapacityStep) bool { return s.Tenants > 0 })
	var parts []string
	for _, s := range steps {
		part := fmt.Sprintf("%d:%g", s.Streams, s.Rate)
		if tenants {
			part += fmt.Sprintf(":%d", s.Tenants)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ",")
}

// load is the step's load in words: streams, rate, and its LLM tenants if any.
func (s *CapacityStep) load() string {
	l := fmt.Sprintf("%d streams, %g/s", s.Streams, s.Rate)
	if s.Tenants > 0 {
		l += fmt.Sprintf(", %d llm tenants", s.Tenants)
	}
	return l
}

func verdictLine(missed []string) string {
	if len(missed) == 0 {
		return "every target met"
	}
	return "MISSED " + strings.Join(missed, "; ")
}

func (r *CapacityResults) print(out io.Writer, rep *Report) {
	tw := table(out)
	fmt.Fprint(tw, "step\tstreams\trate/s\trun\t")
	for _, c := range r.Scenario.Classes {
		if c.Arrival == "stream" {
			fmt.Fprintf(tw, "%s p95 ms\tdropped\trtf\t", c.Name)
		} else if hasTarget(c) {
			fmt.Fprintf(tw, "%s p95 ms\tmissed\t", c.Name)
		} else {
			fmt.Fprintf(tw, "%s p95 ms\t%s /s in window\t", c.Name, c.Name)
		}
	}
	llm := r.Scenario.Capacity != nil && len(r.Scenario.Capacity.Tenants) > 0
	if llm {
		fmt.Fprint(tw, "llm tenants\tfirst token p95 ms\ttokens/s\t")
	}
	fmt.Fprintln(tw, "targets\t")
	for _, st := range r.Steps {
		for _, run := range []struct {
			name string
			r    *CollisionRun
		}{{"policy", st.Policy}, {"fifo", st.FIFO}} {
			if run.r == nil {
				continue
			}
			fmt.Fprintf(tw, "%d\t%d\t%g\t%s\t", st.Step, st.Streams, st.Rate, run.name)
			for _, c := range r.Scenario.Classes {
				s := run.r.Classes[c.Name]
				if s == nil {
					s = &ClassStats{}
				}
				switch {
				case c.Arrival == "stream" && s.Stream != nil:
					fmt.Fprintf(tw, "%.1f\t%d/%d\t%.3f\t", s.P95MS, s.Stream.Dropped, s.Stream.Frames, s.Stream.RTF)
				case c.Arrival == "stream":
					fmt.Fprint(tw, "-\t-\t-\t")
				case hasTarget(c):
					fmt.Fprintf(tw, "%.1f\t%d/%d\t", s.P95MS, missed(s), s.Count)
				default:
					fmt.Fprintf(tw, "%.1f\t%.2f\t", s.P95MS, s.WindowThroughputPerS)
				}
			}
			if llm {
				if t := run.r.Tenant; t != nil {
					fmt.Fprintf(tw, "%d\t%.1f\t%.2f\t", t.Tenants, t.FirstTokenP95MS, t.TokensPerS)
				} else {
					fmt.Fprint(tw, "0\t-\t-\t")
				}
			}
			v := "met"
			if len(st.Missed[run.name]) > 0 {
				v = "MISSED"
			}
			fmt.Fprintf(tw, "%s\t\n", v)
		}
	}
	tw.Flush()
	for _, name := range []string{"policy", "fifo"} {
		k := r.Knee[name]
		if k == nil {
			continue
		}
		if k.Step == 0 {
			fmt.Fprintf(out, "knee, %s: none within the steps (every target met up to step %d: %d streams, %g/s)\n", name, k.LastMet, k.LastMetStreams, k.LastMetRate)
			continue
		}
		last := "no step met every target"
		if k.LastMet > 0 {
			last = fmt.Sprintf("last step meeting every target: %d (%d streams, %g/s)", k.LastMet, k.LastMetStreams, k.LastMetRate)
		}
		fmt.Fprintf(out, "knee, %s: step %d (%d streams, %g/s): %s; %s\n", name, k.Step, k.Streams, k.Rate, strings.Join(k.Missed, "; "), last)
		rep.note("%s: knee at step %d (%d streams, %g/s): %s", name, k.Step, k.Streams, k.Rate, strings.Join(k.Missed, "; "))
	}
	fmt.Fprintf(out, "seed %d\n", r.Seed)
}
