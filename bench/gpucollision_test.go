package bench

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestGPUScenario: the GPU scenarios' pools run webgpu on the device "gpu" (speech with a
// CPU fallback), their tenant is the llama engine on it, gated, with urgent as its gate
// target; resolving the device names the GPU everywhere and keeps [devices] gpu's
// capacity only for the logical GPU; an ocr class's image must be a multiple of 32.
func TestGPUScenario(t *testing.T) {
	for _, name := range []string{"gpu", "gpu-short"} {
		sc, err := LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		if !sc.usesGPU() || !sc.usesWebGPU() || !sc.NoFIFO || sc.Degrade == nil {
			t.Fatalf("%s: gpu %v webgpu %v no_fifo %v degrade %+v", name, sc.usesGPU(), sc.usesWebGPU(), sc.NoFIFO, sc.Degrade)
		}
		if p := sc.Tenant; p.Engine != engineLlama || p.Device != GPUDevice || !p.Gate || p.GateTarget != "urgent" || p.GPU != "auto" {
			t.Fatalf("%s: tenant %+v", name, p)
		}
		for _, p := range sc.Pools {
			if (p.EP == "webgpu") != (p.Device == GPUDevice) {
				t.Errorf("%s: pool %s: ep %q on device %q", name, p.Name, p.EP, p.Device)
			}
		}
		logical := *sc
		logical.Pools = append([]ScenarioPool(nil), sc.Pools...)
		tenant := *sc.Tenant
		logical.Tenant = &tenant
		logical.Devices = map[string]config.Bytes{GPUDevice: sc.Devices[GPUDevice]}
		logical.resolveGPU(LogicalGPU, true)
		if logical.Devices[LogicalGPU] != sc.Devices[GPUDevice] || logical.Tenant.Device != LogicalGPU || logical.Pools[0].Device != LogicalGPU || logical.usesGPU() {
			t.Errorf("%s: resolved to the logical GPU: devices %v, tenant %s, pool %s", name, logical.Devices, logical.Tenant.Device, logical.Pools[0].Device)
		}
		sc.resolveGPU("cuda:0", false)
		if _, ok := sc.Devices["cuda:0"]; ok || len(sc.Devices) != 0 || sc.Tenant.Device != "cuda:0" {
			t.Errorf("%s: resolved to a GPU: devices %v (its capacity is the driver's), tenant %s", name, sc.Devices, sc.Tenant.Device)
		}
	}
	data, err := builtinScenarios.ReadFile("scenarios/collision-gpu-short.toml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseScenario([]byte(strings.Replace(string(data), "image = 96", "image = 100", 1)), "x"); err == nil || !strings.Contains(err.Error(), "multiple of 32") {
		t.Errorf("an ocr image of 100: %v", err)
	}
}

// TestCollisionPrintGPU: the GPU scenario's report prints each class's latencies over
// solo, each run's GPU memory against the budget, and the gate's targets; on a smoke (no
// GPU) the memory is n/a and nothing is judged, on a GPU a peak over the budget and a
// target class over 1.5x solo are noted. Its chart has no FIFO run.
func TestCollisionPrintGPU(t *testing.T) {
	sc, err := LoadScenario("gpu-short")
	if err != nil {
		t.Fatal(err)
	}
	st := func(p95 float64) *ClassStats {
		return &ClassStats{Count: 10, OK: 10, P50MS: p95 / 2, P95MS: p95, P99MS: p95 * 1.2}
	}
	classes := func(f float64) map[string]*ClassStats {
		return map[string]*ClassStats{"urgent": st(10 * f), "interactive": st(100 * f), "batch": st(1000 * f)}
	}
	tenant := func(tps float64, gated bool) *TenantStats {
		return &TenantStats{Tenants: 1, Gated: gated, Prompts: 5, Tokens: 80, FirstTokenP95MS: 50, TokensPerS: tps, Engine: "llama.cpp", Backend: "cpu"}
	}
	mk := func(g *GPUCollision, peak int64) (*CollisionResults, *strings.Builder, *Report) {
		mem := func() *MemoryPeak {
			if g.MemoryReading == NoMemoryReading {
				return &MemoryPeak{Reading: NoMemoryReading, BudgetBytes: g.BudgetBytes}
			}
			return &MemoryPeak{Reading: g.MemoryReading, Samples: 5, PeakUsedBytes: peak, BudgetBytes: g.BudgetBytes, PeakOfBudget: float64(peak) / float64(g.BudgetBytes)}
		}
		r := &CollisionResults{Scenario: sc, Solo: classes(1), SoloTenant: tenant(500, false), GPU: g,
			Gate:   &CollisionRun{Classes: classes(2), Tenant: tenant(250, true), GPUMemory: mem()},
			Policy: &CollisionRun{Classes: classes(3), Tenant: tenant(400, false), GPUMemory: mem()}}
		r.ratios()
		var out strings.Builder
		rep := newReport("collision")
		r.print(&out, rep)
		return r, &out, rep
	}
	smoke := &GPUCollision{Device: LogicalGPU, Smoke: SmokeLabel, BudgetBytes: 1000, CapacityBytes: 1176, MemoryReading: NoMemoryReading, SafeFraction: 0.85}
	r, out, rep := mk(smoke, 0)
	if v := r.Ratios.VsSolo["gate"]["urgent"]; v == nil || v.P95 != 2 || r.Ratios.VsSolo["policy"]["batch"].P50 != 3 {
		t.Fatalf("vs solo %+v", r.Ratios.VsSolo)
	}
	if l := r.Ratios.LLM; l.GateTarget != "urgent" || l.GateTargetP95OverSolo != 2 || l.TokensGateOverSolo != 0.5 || l.FirstTokenGateOverSolo != 1 {
		t.Fatalf("llm ratios %+v", l)
	}
	if _, initials := collisionRuns(r); initials != "s/g/p" {
		t.Errorf("chart runs %s, want no fifo (no_fifo)", initials)
	}
	chart := filepath.Join(t.TempDir(), "gpu.png")
	if err := writeChart(chart, r); err != nil {
		t.Fatal(err)
	}
	readPNG(t, chart, chartW, collisionH)
	for _, want := range []string{"p95 / solo", "2.00x", "gpu memory reading", NoMemoryReading, "targets not judged", "first token p95 ms: solo 50.0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("smoke: no %q in\n%s", want, out.String())
		}
	}
	if len(rep.Notes) != 0 || strings.Contains(out.String(), "MISSED") {
		t.Errorf("a smoke judged something: notes %v\n%s", rep.Notes, out.String())
	}
	gpu := &GPUCollision{Device: "cuda:0", GPU: GPU{Device: "cuda:0", What: "NVIDIA H200 (nvidia-smi)"}, BudgetBytes: 1000 << 20, CapacityBytes: 1176 << 20,
		MemoryReading: "nvidia-smi (memory.used)", SafeFraction: 0.85}
	_, out, rep = mk(gpu, 1100<<20)
	notes := strings.Join(rep.Notes, "\n")
	for _, want := range []string{"urgent p95 is 2.00x solo", "peak memory 1100 MiB is over its 1000 MiB budget"} {
		if !strings.Contains(notes, want) {
			t.Errorf("gpu: no note %q in %v", want, rep.Notes)
		}
	}
	if strings.Contains(notes, "tokens/s") || !strings.Contains(out.String(), "gpu peak 1100 MiB of the 1000 MiB budget (target within: MISSED)") {
		t.Errorf("gpu: notes %v\n%s", rep.Notes, out.String())
	}
}

// TestCollisionGPU runs `bench collision -scenario gpu-short` end to end: the real models
// on webgpu pools (on lavapipe where there is no GPU), the real llama.cpp tenant (the
// tiny GGUF model) under `ortbus lease --on-pressure`, with and without --gate, and the
// degrade run; every process it starts is stopped by the bench. It checks that every
// figure of the report is there — each class's p50/p95/p99 in every run and over solo,
// the frames dropped, the tenant's first-token latency and tokens/s against solo, the
// GPU's memory against its budget (n/a without a driver reading) — and the degrade run:
// no request lost, speech served by the webgpu pool before the kill and by the CPU pool
// across it. No figure is compared with a bound: the machine may be loaded.
func TestCollisionGPU(t *testing.T) {
	t.Parallel() // see parallel_test.go
	root, bin := realSystem(t, "starts a gateway, webgpu workers and the llama.cpp tenant on the real models")
	testenv.RequireVulkan(t)
	testenv.RequireLLMTenant(t)
	// Minutes where Mesa's shader cache is cold (a fresh CI machine): the webgpu pools
	// compile their shaders at their first load (webgpuStartBound).
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	var table bytes.Buffer
	t0 := time.Now()
	rep, err := Collision(ctx, Options{Repo: root, BinDir: bin, Scenario: "gpu-short", Out: &table})
	t.Logf("collision, gpu-short scenario (%v, load average %s):\n%s", time.Since(t0).Round(time.Millisecond), loadAvg(), table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*CollisionResults)
	g := res.GPU
	if g == nil || g.Adapter == "" || g.BudgetBytes <= 0 || g.TenantBackend == "" {
		t.Fatalf("gpu %+v", g)
	}
	noGPU := g.GPU.Device == ""
	if noGPU && (g.Device != LogicalGPU || g.Smoke != SmokeLabel || g.TenantBackend != "cpu" || g.MemoryReading != NoMemoryReading) {
		t.Errorf("no GPU here, but %+v", g)
	}
	if res.Gate == nil || res.Policy == nil || res.FIFO != nil || res.Solo == nil || res.SoloTenant == nil {
		t.Fatalf("runs: gate %v, policy %v, fifo %v, solo %v", res.Gate != nil, res.Policy != nil, res.FIFO != nil, res.Solo != nil)
	}
	runs := map[string]map[string]*ClassStats{"solo": res.Solo, "gate": res.Gate.Classes, "policy": res.Policy.Classes}
	for run, classes := range runs {
		for _, c := range res.Scenario.Classes {
			s := classes[c.Name]
			if s == nil || s.Count != res.Counts[c.Name] || s.Unanswered > 0 || s.OK == 0 || !(0 < s.P50MS && s.P50MS <= s.P95MS && s.P95MS <= s.P99MS && s.P99MS <= s.MaxMS) {
				t.Errorf("%s run, %s: %+v; want every request answered, some results, 0 < p50 <= p95 <= p99 <= max", run, c.Name, s)
			}
			if v := res.Ratios.VsSolo[run][c.Name]; run != "solo" && (v == nil || v.P50 <= 0 || v.P95 <= 0 || v.P99 <= 0) {
				t.Errorf("%s run, %s: over solo %+v", run, c.Name, v)
			}
		}
		if u := classes["urgent"]; u != nil && (u.Stream == nil || u.Stream.Frames != res.Counts["urgent"] || u.Stream.Dropped != u.Stream.Frames-u.Stream.OnTime) {
			t.Errorf("%s run: urgent stream %+v", run, u.Stream)
		}
	}
	checkTenant := func(run string, s *TenantStats, gated bool) {
		if s == nil || !strings.Contains(s.Engine, "llama.cpp") || s.Backend != g.TenantBackend || s.Gated != gated || s.Prompts == 0 ||
			s.Tokens != res.Scenario.Tenant.Tokens*s.Prompts || s.FirstTokenP95MS <= 0 || s.TokensPerS <= 0 || (s.Pauses > 0) != gated || s.Frees != 0 {
			t.Errorf("%s run: llm tenant %+v, want llama.cpp answering whole generations (gated %v, paused then), no frees", run, s, gated)
		}
	}
	checkTenant("solo", res.SoloTenant, false)
	checkTenant("gate", res.Gate.Tenant, true)
	checkTenant("policy", res.Policy.Tenant, false)
	if l := res.Ratios.LLM; l == nil || l.TokensGateOverSolo <= 0 || l.TokensPolicyOverSolo <= 0 || l.FirstTokenGateOverSolo <= 0 || l.FirstTokenPolicyOverSolo <= 0 || l.GateTarget != "urgent" || l.GateTargetP95OverSolo <= 0 {
		t.Errorf("llm ratios %+v", l)
	}
	mems := []*MemoryPeak{res.Gate.GPUMemory, res.Policy.GPUMemory, res.SoloGPUMemory[soloTenantKey], res.Degrade.Run.GPUMemory}
	for _, c := range res.Scenario.Classes {
		mems = append(mems, res.SoloGPUMemory[c.Name])
	}
	for i, m := range mems {
		if m == nil || m.BudgetBytes != g.BudgetBytes || (m.Reading == NoMemoryReading) != (m.Samples == 0) || (noGPU && m.Reading != NoMemoryReading) || (m.Samples > 0 && m.PeakUsedBytes <= 0) {
			t.Errorf("gpu memory %d: %+v", i, m)
		}
	}
	d := res.Degrade
	if d.Lost != 0 || d.Sent == 0 || d.Answered != d.Sent || len(d.Killed) == 0 || len(d.Phases) != 3 {
		t.Fatalf("degrade run: sent %d, answered %d, lost %d, killed %v, %d phases", d.Sent, d.Answered, d.Lost, d.Killed, len(d.Phases))
	}
	before, across := d.Phases[0], d.Phases[1]
	if before.ByPool[d.Pool] == 0 || across.ByPool[d.Fallback[0]] == 0 || across.ByPool[d.Pool] != 0 || across.P95MS <= 0 {
		t.Errorf("degrade run: before %+v, across %+v; want %s serving before the kill, %s across it", before, across, d.Pool, d.Fallback[0])
	}
	memory := "with the gate: gpu peak "
	if g.MemoryReading == NoMemoryReading {
		memory = "gpu peak memory vs the 85% budget: " + NoMemoryReading
	}
	for _, want := range []string{"p95 / solo", "audio frames dropped: solo", "first token p95 ms: solo", "llm tokens/s: solo", "gpu memory reading", memory,
		"degrade phase", "0 lost (target 0: ok)", "llm tenant backend: -gpu " + g.TenantBackend} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the printed report lacks %q", want)
		}
	}
}
