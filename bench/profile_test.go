package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestProfileReportShape: the profile's JSON has services[] with every key seed 2's
// first step asks for — p95_ms, items_per_s, cpu_percent, memory_idle_bytes,
// memory_peak_bytes, and power_w or power_note — and its table says where each figure
// comes from.
func TestProfileReportShape(t *testing.T) {
	w := 41.5
	res := &ProfileResults{Scenario: "gpu-short", Services: []*ServiceProfile{
		{Name: "urgent", Kind: "class", Model: "vad", Pools: []string{"rt", "rtcpu"}, Device: "gpu:0", EP: "webgpu", Count: 60, OK: 60, P95MS: 12.5, ItemsPerS: 30,
			CPUPercent: 80, MemoryIdleBytes: 100 << 20, MemoryPeakBytes: 120 << 20, MemorySource: "host RSS", PowerNote: "no power reading: no RAPL zone", Smoke: SmokeLabel},
		{Name: "batch", Kind: "class", Model: "tagger", Device: "cpu", EP: "cpu", Count: 20, OK: 20, P95MS: 300, ItemsPerS: 10,
			CPUPercent: 190, MemoryIdleBytes: 50 << 20, MemoryPeakBytes: 90 << 20, MemorySource: "host RSS", PowerW: &w, PowerSource: "RAPL"},
	}}
	b, err := json.Marshal(&Report{Bench: "profile", Results: res})
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Results struct {
			Services []map[string]any `json:"services"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Results.Services) != 2 {
		t.Fatalf("services: %s", b)
	}
	for i, s := range back.Results.Services {
		for _, k := range []string{"name", "p95_ms", "items_per_s", "cpu_percent", "memory_idle_bytes", "memory_peak_bytes", "memory_source"} {
			if _, ok := s[k]; !ok {
				t.Errorf("service %d: no %q in %v", i, k, s)
			}
		}
		_, pw := s["power_w"]
		_, pn := s["power_note"]
		if pw == pn {
			t.Errorf("service %d: power_w %v, power_note %v: want exactly one", i, pw, pn)
		}
	}
	var out bytes.Buffer
	res.print(&out)
	for _, want := range []string{"urgent [" + SmokeLabel + "]", "41.5", "no power reading: no RAPL zone", "power from RAPL", "memory from host RSS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestPowerMeterRAPL: the RAPL reading is the packages' energy over the time between
// start and stop (subzones not counted twice, a wrapped counter unwrapped); without a
// zone, or with an unreadable one, there is no figure and the note says why.
func TestPowerMeterRAPL(t *testing.T) {
	root := t.TempDir()
	old := raplRoot
	raplRoot = root
	t.Cleanup(func() { raplRoot = old })
	m := newPowerMeter("cpu")
	if w, note := m.stop(); w != nil || !strings.Contains(note, "no RAPL zone") {
		t.Errorf("no zone: %v, %q", w, note)
	}
	if w, note := newPowerMeter("drm:1").stop(); w != nil || !strings.Contains(note, "drm:1") {
		t.Errorf("drm:1: %v, %q", w, note)
	}
	write := func(rel, v string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("intel-rapl:0/energy_uj", "999000000")
	write("intel-rapl:0/max_energy_range_uj", "1000000000")
	write("intel-rapl:0:0/energy_uj", "5")
	write("intel-rapl:1/energy_uj", "not a number")
	m = newPowerMeter("cpu")
	if len(m.rapl) != 1 || m.source == "" {
		t.Fatalf("zones %v, source %q", m.rapl, m.source)
	}
	m.start()
	m.t0 = time.Now().Add(-2 * time.Second)     // as if 2 s had passed
	write("intel-rapl:0/energy_uj", "19000000") // wrapped: 1 J + 19 J = 20 J
	w, note := m.stop()
	if w == nil || *w < 9 || *w > 10.01 || note != "" {
		t.Errorf("20 J over ~2 s: %v W, %q", w, note)
	}
}

// TestProcSampler: sampling this process reads its resident memory and CPU time.
func TestProcSampler(t *testing.T) {
	s := newProcSampler(func() []int { return []int{os.Getpid(), 1 << 30} }, "cpu")
	s.takeIdle()
	// Work until the sampler sees this process's CPU time grow (clock ticks of 10 ms).
	x := 0
	for s.cpuSeconds() <= 0 && t.Context().Err() == nil {
		for i := range 1 << 20 {
			x ^= i
		}
		s.sample()
	}
	_ = x
	if s.idle <= 0 || s.peak < s.idle || s.samples < 2 || s.cpuSeconds() <= 0 {
		t.Errorf("idle %d, peak %d, samples %d, cpu %v", s.idle, s.peak, s.samples, s.cpuSeconds())
	}
	if d := descendants(os.Getpid()); len(d) != 0 {
		t.Logf("descendants of the test process: %v", d)
	}
}

// TestProfileGPUShort: `bench profile -scenario gpu-short` for real on this machine (on
// lavapipe without a GPU, each GPU service marked as not a GPU figure): every service
// of the scenario measured alone, with results, CPU use and memory, and power or why not.
func TestProfileGPUShort(t *testing.T) {
	root, bin := realSystem(t, "starts a gateway, webgpu workers and the llama.cpp tenant on the real models")
	testenv.RequireVulkan(t)
	testenv.RequireLLMTenant(t)
	// Minutes where Mesa's shader cache is cold (as TestCollisionGPU).
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	var out bytes.Buffer
	t0 := time.Now()
	rep, err := Profile(ctx, Options{Repo: root, BinDir: bin, Scenario: "gpu-short", Out: &out})
	t.Logf("profile -scenario gpu-short (%v):\n%s", time.Since(t0).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*ProfileResults)
	sc, err := LoadScenario("gpu-short")
	if err != nil {
		t.Fatal(err)
	}
	want := len(sc.Classes)
	if sc.Tenant != nil {
		want++
	}
	if len(res.Services) != want {
		t.Fatalf("%d services, want %d", len(res.Services), want)
	}
	for _, s := range res.Services {
		if s.OK == 0 || s.P95MS <= 0 || s.ItemsPerS <= 0 || s.CPUPercent <= 0 || s.MemoryPeakBytes <= 0 || s.MemoryIdleBytes <= 0 {
			t.Errorf("service %s: %+v", s.Name, s)
		}
		if (s.PowerW == nil) == (s.PowerNote == "") {
			t.Errorf("service %s: power %v, note %q: want one", s.Name, s.PowerW, s.PowerNote)
		}
		if res.GPU != nil && res.GPU.Smoke != "" && s.Device == res.GPU.Device && s.Smoke == "" {
			t.Errorf("service %s on the logical GPU %s without the smoke label", s.Name, s.Device)
		}
	}
	for _, n := range rep.Notes {
		t.Logf("note: %s", n)
	}
}
