package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCollisionLLM runs `bench collision -scenario llm-short` end to end (the real models,
// 3 s a run, a tiny decoder as the LLM tenant under `ortbus lease`) and checks only that
// the path works: the solo runs (the tenant alone included), the runs with every class and
// the tenant under the policy (with the gate when the ortbus binary's lease has --gate,
// else a note says there is no gated run) and under FIFO; in each, every frame and request
// answered, the tenant answering prompts with a first-token latency and a decode rate, the
// urgent class's degrade figures, and the LLM ratios and the chart. No figure is compared
// with a bound: the machine may be loaded.
func TestCollisionLLM(t *testing.T) {
	t.Parallel() // see parallel_test.go
	root, bin := realSystem(t, "starts a gateway, workers and LLM tenants on the real models")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var table bytes.Buffer
	chart := filepath.Join(t.TempDir(), "collision-llm.png")
	rep, err := Collision(ctx, Options{Repo: root, BinDir: bin, Scenario: "llm-short", Out: &table, Chart: chart})
	t.Logf("collision, llm-short scenario (load average %s):\n%s", loadAvg(), table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*CollisionResults)
	if res.FIFO == nil {
		t.Fatalf("no FIFO run (%s)", res.PolicyKey)
	}
	runs := map[string]*CollisionRun{"policy": res.Policy, "fifo": res.FIFO}
	if res.Gate != nil {
		runs["gate"] = res.Gate
	} else if !strings.Contains(strings.Join(rep.Notes, "\n"), "no gated run") {
		t.Errorf("no gated run and no note saying why: %v", rep.Notes)
	}
	// A gated tenant is paused at least once in a run of camera bursts (interactive work of
	// about 100 ms a frame on its device, whose gate_class is interactive); one without the
	// gate never is.
	checkTenant := func(run string, s *TenantStats, gated bool) {
		if s == nil || s.Tenants != 1 || s.Gated != gated || s.Prompts == 0 || s.Tokens != 8*s.Prompts || s.FirstTokenP95MS <= 0 || s.TokensPerS <= 0 ||
			(s.Pauses > 0) != gated {
			t.Errorf("%s run: llm tenant %+v, want 1 tenant (gated %v, paused then) that answered prompts of 8 tokens", run, s, gated)
		}
	}
	checkTenant("solo", res.SoloTenant, false)
	for run, r := range runs {
		checkTenant(run, r.Tenant, run == "gate")
		for class, s := range r.Classes {
			if s.Unanswered > 0 {
				t.Errorf("%s run: %d %s requests unanswered", run, s.Unanswered, class)
			}
		}
		u := r.Classes["urgent"]
		if u == nil || u.Stream == nil || u.Stream.Frames != res.Counts["urgent"] || u.Stream.Errors != 0 || u.Stream.OnTime == 0 {
			t.Errorf("%s run: urgent stream %+v, want %d frames, some on time, no errors", run, u, res.Counts["urgent"])
		} else if d := u.Degraded; d == nil || d.Preferred != "rt" || d.Count > u.OK {
			t.Errorf("%s run: urgent degrade figures %+v, want those of pool rt's fallback", run, d)
		}
		if i := r.Classes["interactive"]; i == nil || i.OK != i.Count || i.Count != res.Counts["interactive"] {
			t.Errorf("%s run: interactive %+v, want every detector request served", run, i)
		}
		if b := r.Classes["batch"]; b == nil || b.OK != b.Count || b.Count != res.Counts["batch"] {
			t.Errorf("%s run: batch %+v, want every request served", run, b)
		}
	}
	if l := res.Ratios.LLM; l == nil || l.TokensPerSSolo <= 0 || l.TokensPerSPolicy <= 0 || l.TokensPerSFIFO <= 0 {
		t.Errorf("llm ratios %+v, want every run's tokens/s", l)
	}
	for _, want := range []string{"llm tenants", "degraded urgent", "llm tokens/s"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the printed report lacks %q", want)
		}
	}
	readPNG(t, chart, chartW, collisionH)
}

// TestCapacityLLM runs `bench capacity -scenario capacity-llm` end to end on two short
// steps, the second with an LLM tenant (a tiny decoder: the scenario file with its
// [tenant] made small), and checks that the tenant is a step dimension: no tenant figures
// at the step without one, a tenant answering prompts at the step with one (gated under
// the policy when the lease has --gate, never under FIFO), the table's tenant columns and
// the chart. No figure is compared with a bound.
func TestCapacityLLM(t *testing.T) {
	t.Parallel() // see parallel_test.go
	root, bin := realSystem(t, "starts gateways, workers and an LLM tenant on the real models")
	data, err := builtinScenarios.ReadFile("scenarios/capacity-llm.toml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for old, repl := range map[string]string{"prompt = 1536": "prompt = 64\nlayers = 1\nwidth = 64", "tokens = 64": "tokens = 8",
		"heavy_layers = 8": "heavy_layers = 2", `start = "1s"             # with the measured`: `start = "0s"             # with the measured`} {
		if !strings.Contains(text, old) {
			t.Fatalf("capacity-llm.toml has no %q any more: update the test", old)
		}
		text = strings.Replace(text, old, repl, 1)
	}
	scenario := filepath.Join(t.TempDir(), "capacity-llm-tiny.toml")
	if err := os.WriteFile(scenario, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var table bytes.Buffer
	chart := filepath.Join(t.TempDir(), "capacity-llm.png")
	rep, err := Capacity(ctx, Options{Repo: root, BinDir: bin, Scenario: scenario, Steps: "1:0.5:0,1:0.5:1", Duration: 3 * time.Second, Out: &table, Chart: chart})
	t.Logf("capacity, capacity-llm with a tiny tenant (load average %s):\n%s", loadAvg(), table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*CapacityResults)
	if len(res.Steps) != 2 || res.Steps[0].Tenants != 0 || res.Steps[1].Tenants != 1 {
		t.Fatalf("steps %+v, want 2 steps with 0 then 1 tenant", res.Steps)
	}
	gated := !strings.Contains(strings.Join(rep.Notes, "\n"), "not gated")
	for name, run := range map[string]func(*CapacityStep) *CollisionRun{"policy": func(s *CapacityStep) *CollisionRun { return s.Policy },
		"fifo": func(s *CapacityStep) *CollisionRun { return s.FIFO }} {
		r0, r1 := run(res.Steps[0]), run(res.Steps[1])
		if r0 == nil || r1 == nil {
			// A knee at step 1 with after_knee 1 still runs step 2.
			t.Fatalf("%s: a step was not run", name)
		}
		if r0.Tenant != nil {
			t.Errorf("%s step 1: tenant figures %+v without a tenant", name, r0.Tenant)
		}
		if s := r1.Tenant; s == nil || s.Tenants != 1 || s.Prompts == 0 || s.TokensPerS <= 0 || s.Gated != (gated && name == "policy") {
			t.Errorf("%s step 2: tenant %+v, want 1 tenant answering prompts (gated: %v)", name, s, gated && name == "policy")
		}
	}
	if !strings.Contains(table.String(), "llm tenants") || !strings.Contains(table.String(), "1:0.5:1") {
		t.Errorf("the printed report lacks the tenant columns or the step list")
	}
	readPNG(t, chart, chartW, capacityH)
}

// TestTenantPlan: a [tenant] table's defaults and checks, and the config it gives: the
// declared device capacity, and the device's gate_class when the plan names one.
func TestTenantPlan(t *testing.T) {
	data, err := builtinScenarios.ReadFile("scenarios/collision-llm-short.toml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	sc, err := ParseScenario([]byte(text), "x")
	if err != nil {
		t.Fatal(err)
	}
	if p := sc.Tenant; p.Count != 1 || p.Threads != 1 || p.Device != "gpu:0" || p.Class != "interactive" || p.spec().FF != 4*p.Width {
		t.Errorf("plan %+v", p)
	}
	dir := t.TempDir()
	w := &workdir{dir: dir, models: filepath.Join(dir, "models"), images: filepath.Join(dir, "images"),
		fetched: map[string]string{"vad": filepath.Join(dir, "vad"), "ocr": filepath.Join(dir, "ocr")}}
	c := collisionConfig(sc, w, "/ort/libonnxruntime.so.1")
	if d := c.Devices["gpu:0"]; d.GateClass != "interactive" || d.Capacity != 16<<30 {
		t.Errorf("device gpu:0 is %+v, want 16 GiB and gate_class interactive", d)
	}
	for _, bad := range []string{
		`gate_class = "nobody"`,
		`prompt = 2048`,
		`min_share = 2.0`,
	} {
		key := strings.SplitN(bad, " ", 2)[0]
		lines := strings.Split(text, "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, key+" ") {
				lines[i] = bad
			}
		}
		if _, err := ParseScenario([]byte(strings.Join(lines, "\n")), "x"); err == nil || !strings.Contains(err.Error(), "[tenant]") {
			t.Errorf("%s: %v, want a [tenant] error", bad, err)
		}
	}
}
