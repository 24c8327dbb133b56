package bench

// The degrade run of a collision scenario ([degrade]; issue 32 item 4): the classes run
// as in the runs with the gate, and at kill_at every worker of the first pool of the
// measured class's chain (the GPU pool) is killed with SIGKILL — the pool lost mid-run.
// The gateway answers or retries what the workers held (gateway/lifecycle.go, L7), sends
// the class's next requests to the next pool of its chain (the CPU pool) while the first
// has no live worker, and back to it once its supervisor's replacement is live. The run
// reports the class's latency before the kill, across the switch (from the kill until the
// first result the pool serves again) and after, by pool, and over every class the
// requests sent, answered and lost (sent and never answered: the target is 0).

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// DegradePlan is a scenario's [degrade] table.
type DegradePlan struct {
	// Class is the class whose switch is measured (default urgent). The pool killed is
	// the first of its chain, which must have a pool after it.
	Class string `toml:"class" json:"class"`
	// KillAt is when, after the run's start, the pool's workers are killed (default,
	// and whenever it is not within the window: a third of the window).
	KillAt config.Duration `toml:"kill_at" json:"kill_at,omitempty"`
	// Classes are the classes that run (default every class).
	Classes []string `toml:"classes" json:"classes,omitempty"`
	// Tenant runs the scenario's LLM tenant too (gated when it has gate).
	Tenant bool `toml:"tenant" json:"tenant,omitempty"`
	// Window is the run's arrival window (default the scenario's): long enough for the
	// pool's replacement to come back within it.
	Window config.Duration `toml:"window" json:"window,omitempty"`
}

// checkDegrade checks s's [degrade] table and fills in its class.
func (s *Scenario) checkDegrade(d *DegradePlan) error {
	if d.Class == "" {
		d.Class = subjects.ClassUrgent
	}
	i := slices.IndexFunc(s.Classes, func(c ScenarioClass) bool { return c.Name == d.Class })
	if i < 0 {
		return fmt.Errorf("class %q is not one of the scenario's", d.Class)
	}
	if len(s.chain(d.Class, s.Classes[i].Model)) < 2 {
		return fmt.Errorf("class %s: its chain needs a pool after its first, to move to", d.Class)
	}
	if d.KillAt < 0 || d.Window < 0 {
		return fmt.Errorf("kill_at and window must not be negative")
	}
	for _, c := range d.Classes {
		if !slices.ContainsFunc(s.Classes, func(x ScenarioClass) bool { return x.Name == c }) {
			return fmt.Errorf("classes: %q is not one of the scenario's", c)
		}
	}
	if len(d.Classes) > 0 && !slices.Contains(d.Classes, d.Class) {
		return fmt.Errorf("classes must include the class measured, %s", d.Class)
	}
	if d.Tenant && s.Tenant == nil {
		return fmt.Errorf("tenant = true needs a [tenant] table")
	}
	return nil
}

// degradeChain is the chain of the degrade run's class: its first pool is killed.
func (s *Scenario) degradeChain() []string {
	i := slices.IndexFunc(s.Classes, func(c ScenarioClass) bool { return c.Name == s.Degrade.Class })
	return s.chain(s.Degrade.Class, s.Classes[i].Model)
}

// killAt is when the plan's kill comes in a run of window.
func (d *DegradePlan) killAt(window time.Duration) time.Duration {
	if d.KillAt <= 0 || d.KillAt.D() >= window {
		return window / 3
	}
	return d.KillAt.D()
}

// DegradeRun is the degrade run's results: the results' "degrade_run".
type DegradeRun struct {
	Class string `json:"class"`
	// Pool is the pool whose workers were killed (Killed), Fallback the chain's pools
	// after it.
	Pool     string   `json:"pool"`
	Fallback []string `json:"fallback"`
	Killed   []string `json:"killed_workers"`
	// KillAtMS is the kill's time from the run's start; ReplacementLiveMS from the kill
	// until the gateway's status showed a new worker of the pool live, BackMS until the
	// due time of the first request of the class the pool served again (-1: not within
	// the run).
	KillAtMS          float64 `json:"kill_at_ms"`
	ReplacementLiveMS float64 `json:"replacement_live_ms"`
	BackMS            float64 `json:"back_ms"`
	// Phases are the class's figures before the kill, across the switch (from the kill
	// until BackMS) and after.
	Phases []*DegradePhase `json:"phases"`
	// Sent, Answered and Lost (sent and never answered) are over every class of the run
	// (stream frames the client skipped are not sent); Outcomes its answers by code
	// ("ok" for a result).
	Sent     int            `json:"sent"`
	Answered int            `json:"answered"`
	Lost     int            `json:"lost"`
	Outcomes map[string]int `json:"outcomes"`
	// Run is every class's figures in the run.
	Run *CollisionRun `json:"run"`
}

// DegradePhase is the measured class's figures in one phase of the degrade run, by the
// requests' due (frames) or send times.
type DegradePhase struct {
	Phase  string  `json:"phase"`
	FromMS float64 `json:"from_ms"`
	ToMS   float64 `json:"to_ms"`
	Count  int     `json:"count"`
	OK     int     `json:"ok"`
	P50MS  float64 `json:"p50_ms"`
	P95MS  float64 `json:"p95_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
	// Missed are deadline misses (frames: dropped), errors and requests unanswered.
	Missed int `json:"missed"`
	// ByPool are the results by the pool that served them.
	ByPool map[string]int `json:"by_pool"`
}

// degradeKill is the kill of a run: done in the run's hook, read after it (the run
// waits for its hook to return before its statistics).
type degradeKill struct {
	sys    *system
	pool   string
	at     time.Duration
	killed []string
	// killedAt and liveAt are the kill's time and the replacement's (zero: none).
	killedAt, liveAt time.Time
	err              error
}

// during waits until the kill's time, kills every ready worker of the pool, then follows
// the gateway's status until a new worker of the pool is ready (or the run ends).
func (d *degradeKill) during(ctx context.Context, start time.Time) {
	if sleepUntil(ctx, start.Add(d.at)) != nil {
		return
	}
	st, err := d.sys.status(ctx)
	if err != nil {
		d.err = fmt.Errorf("status before the kill: %w", err)
		return
	}
	for _, w := range st.Workers {
		if w.Pool != d.pool || w.State != codec.StateReady || w.PID <= 0 {
			continue
		}
		if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
			d.err = fmt.Errorf("kill -9 %d (%s): %w", w.PID, w.Worker, err)
			return
		}
		d.killed = append(d.killed, w.Worker)
	}
	d.killedAt = time.Now()
	if len(d.killed) == 0 {
		d.err = fmt.Errorf("pool %s had no ready worker to kill", d.pool)
		return
	}
	for ctx.Err() == nil {
		if st, err := d.sys.status(ctx); err == nil {
			for _, w := range st.Workers {
				if w.Pool == d.pool && w.State == codec.StateReady && !slices.Contains(d.killed, w.Worker) {
					d.liveAt = time.Now()
					return
				}
			}
		}
		sleepUntil(ctx, time.Now().Add(20*time.Millisecond))
	}
}

// runDegrade makes the degrade run on sys: the plan's classes (their part of the
// schedule, over the plan's window) and, when it says so, the tenants (gated when there
// is a gated run, else plain).
func runDegrade(ctx context.Context, sys *system, scenario *Scenario, setup *scenarioSetup, plain, gated *tenantRun) (*DegradeRun, error) {
	plan := scenario.Degrade
	sc := scenario
	if plan.Window > 0 {
		c := *scenario
		c.Window = plan.Window
		sc = &c
	}
	ci := slices.IndexFunc(sc.Classes, func(c ScenarioClass) bool { return c.Name == plan.Class })
	chain := sc.degradeChain()
	active := make([]bool, len(sc.Classes))
	var only []arrival
	for i, c := range sc.Classes {
		active[i] = len(plan.Classes) == 0 || slices.Contains(plan.Classes, c.Name)
	}
	for _, a := range sc.Schedule() {
		if active[a.Class] {
			only = append(only, a)
		}
	}
	var tenants *tenantRun
	if plan.Tenant {
		tenants = plain
		if gated != nil {
			tenants = gated
		}
	}
	kill := &degradeKill{sys: sys, pool: chain[0], at: plan.killAt(sc.Window.D())}
	var calls []call
	var start time.Time
	hooks := runHooks{during: kill.during, done: func(cs []call, frames [][]frameRec, s time.Time) {
		start = s
		for i := range frames[ci] {
			cs = append(cs, frames[ci][i].asCall(plan.Class))
		}
		calls = cs
	}}
	run, err := runScheduleWith(ctx, sys, sc, only, setup.reqs, active, tenants, hooks)
	if err != nil {
		return nil, err
	}
	if kill.err != nil {
		return nil, fmt.Errorf("degrade run: %w", kill.err)
	}
	d := &DegradeRun{Class: plan.Class, Pool: chain[0], Fallback: chain[1:], Killed: kill.killed, Run: run, Outcomes: map[string]int{}}
	d.tally(sc, calls, run, kill, start)
	return d, nil
}

// tally computes the phases of the class's calls and the counts of every class's.
// calls are the run's calls with the measured class's frames among them.
func (d *DegradeRun) tally(sc *Scenario, calls []call, run *CollisionRun, kill *degradeKill, start time.Time) {
	since := func(t time.Time) float64 { return ms(t.Sub(start)) }
	d.KillAtMS, d.ReplacementLiveMS, d.BackMS = since(kill.killedAt), -1, -1
	if !kill.liveAt.IsZero() {
		d.ReplacementLiveMS = ms(kill.liveAt.Sub(kill.killedAt))
	}
	var mine []call
	back := time.Time{}
	for _, k := range calls {
		if k.Code != codeSkipped {
			d.Sent++
			if k.Done {
				d.Answered++
				d.Outcomes[orDefault(k.Code, "ok")]++
			}
		}
		if k.Class != d.Class {
			continue
		}
		mine = append(mine, k)
		if k.Done && k.Code == "" && k.Pool == d.Pool && !k.Sent.Before(kill.killedAt) && (back.IsZero() || k.Sent.Before(back)) {
			back = k.Sent
		}
	}
	d.Lost = d.Sent - d.Answered
	end := start.Add(sc.Window.D())
	if !back.IsZero() {
		d.BackMS = ms(back.Sub(kill.killedAt))
	} else {
		back = end // the pool never served the class again in the run: no after
	}
	bounds := []struct {
		name     string
		from, to time.Time
	}{{"before", start, kill.killedAt}, {"across", kill.killedAt, back}, {"after", back, end}}
	for i, b := range bounds {
		var in []call
		for _, k := range mine {
			// The last phase takes every call from its start (a request is due or sent
			// before the window's end).
			if !k.Sent.Before(b.from) && (k.Sent.Before(b.to) || i == len(bounds)-1) {
				in = append(in, k)
			}
		}
		d.Phases = append(d.Phases, degradePhase(b.name, in, since(b.from), since(b.to), start, end))
	}
}

// degradePhase is one phase's figures of its calls.
func degradePhase(name string, calls []call, from, to float64, start, end time.Time) *DegradePhase {
	s := classStats(calls, start, end)
	p := &DegradePhase{Phase: name, FromMS: from, ToMS: max(from, to), Count: s.Count, OK: s.OK, P50MS: s.P50MS, P95MS: s.P95MS, P99MS: s.P99MS, MaxMS: s.MaxMS,
		Missed: missed(s), ByPool: map[string]int{}}
	for _, k := range calls {
		if k.Done && k.Code == "" {
			p.ByPool[k.Pool]++
		}
	}
	return p
}

// print prints the degrade run: the kill, the phases, and the lost requests' target.
func (d *DegradeRun) print(out io.Writer, rep *Report) {
	fmt.Fprintf(out, "degrade: kill -9 of pool %s's worker(s) %s at %.0f ms into the run (class %s, fallback %s); replacement live after %s; pool %s served %s again after %s\n",
		d.Pool, strings.Join(d.Killed, ", "), d.KillAtMS, d.Class, strings.Join(d.Fallback, ", "), msOrNone(d.ReplacementLiveMS), d.Pool, d.Class, msOrNone(d.BackMS))
	var rows []string
	for _, p := range d.Phases {
		var by []string
		for _, pool := range slices.Sorted(maps.Keys(p.ByPool)) {
			by = append(by, fmt.Sprintf("%s:%d", pool, p.ByPool[pool]))
		}
		rows = append(rows, fmt.Sprintf("%s %s\t%.0f-%.0f\t%d\t%d\t%.1f\t%.1f\t%.1f\t%d\t%s\t", d.Class, p.Phase, p.FromMS, p.ToMS, p.Count, p.OK, p.P50MS, p.P95MS, p.P99MS, p.Missed, strings.Join(by, " ")))
	}
	printTable(out, "degrade phase\tms of the run\tcount\tok\tp50 ms\tp95 ms\tp99 ms\tmissed\tresults by pool\t", rows...)
	ok := rep.target(d.Lost == 0, "the degrade run lost %d of %d requests (sent, never answered; target 0)", d.Lost, d.Sent)
	var outcomes []string
	for _, c := range slices.Sorted(maps.Keys(d.Outcomes)) {
		outcomes = append(outcomes, fmt.Sprintf("%s:%d", c, d.Outcomes[c]))
	}
	fmt.Fprintf(out, "degrade: %d requests sent, %d answered (%s), %d lost (target 0: %s)\n", d.Sent, d.Answered, strings.Join(outcomes, " "), d.Lost, verdict(ok))
	if len(d.Phases) == 3 {
		fmt.Fprintf(out, "degrade: %s p95 before %.1f ms, across the switch %.1f ms, after %.1f ms\n", d.Class, d.Phases[0].P95MS, d.Phases[1].P95MS, d.Phases[2].P95MS)
	}
}

// msOrNone is "N ms", or "none within the run" for -1.
func msOrNone(v float64) string {
	if v < 0 {
		return "none within the run"
	}
	return fmt.Sprintf("%.0f ms", v)
}
