package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func reportJSON(t *testing.T, bench string, results any) []byte {
	t.Helper()
	b, err := json.Marshal(&Report{Bench: bench, Results: results})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUnmeasuredReports: each report's targets without a figure are named — a throughput
// model whose node path was skipped, a profiled service without power or memory, a GPU
// collision without its gated run, its tenant's figures, its degrade run, the policy
// run's peak memory or a memory check that could not be made — and a complete report
// names none; a smoke names every GPU figure at once.
func TestUnmeasuredReports(t *testing.T) {
	power := 250.0
	full := &ServiceProfile{Name: "urgent", P95MS: 12, ItemsPerS: 30, CPUPercent: 40, MemoryIdleBytes: 1, MemoryPeakBytes: 2, PowerW: &power}
	bare := &ServiceProfile{Name: "llm_tenant", P95MS: 80, ItemsPerS: 20, CPUPercent: 90, MemoryPeakBytes: 2, PowerNote: "no RAPL here"}
	gpu := &GPUCollision{Device: "cuda:0", MemoryChecks: []*MemCheck{{Run: "policy", Verdict: "ok"}, {Run: "fifo", Verdict: "not measured: status: timeout"}}}
	sc := &Scenario{Tenant: &TenantPlan{}, Degrade: &DegradePlan{}}
	peak := &MemoryPeak{Reading: "nvidia-smi", Samples: 3}
	tp := &ThroughputResults{Ratios: map[string]ThroughputRatios{"det": {SystemOverInProcess: 1.1, SystemOverNode: 1.2}, "tagger": {SystemOverInProcess: 1.0}}}
	tp.Setup.Node.Skipped = "make node-bench"
	tp.Setup.WebGPU = &WebGPUSetup{Device: "cuda:0"}
	for _, c := range []struct {
		name   string
		report []byte
		want   []string
	}{
		{"throughput", reportJSON(t, "throughput", tp), []string{"tagger: the system against onnxruntime-node (make node-bench)"}},
		{"profile", reportJSON(t, "profile", &ProfileResults{GPU: &GPUCollision{Device: "cuda:0"}, Services: []*ServiceProfile{full, bare}}),
			[]string{"llm_tenant: memory_idle_bytes (no figure)", "llm_tenant: power_w (no RAPL here)"}},
		{"profile, none", reportJSON(t, "profile", &ProfileResults{}), []string{"every service (none profiled)"}},
		{"collision", reportJSON(t, "collision", &CollisionResults{Scenario: sc, Solo: map[string]*ClassStats{}, Policy: &CollisionRun{GPUMemory: &MemoryPeak{Reading: NoMemoryReading}}, GPU: gpu}),
			[]string{"the degrade_run run (absent)", "the policy_gate run (absent)", "the llm tenant's tokens/s and first token against solo (absent)",
				"the GPU's peak memory in the policy run (" + NoMemoryReading + ")", "fifo: the workers' device memory against the device's (not measured: status: timeout)"}},
		{"collision, complete", reportJSON(t, "collision", &CollisionResults{Scenario: &Scenario{}, Solo: map[string]*ClassStats{}, Policy: &CollisionRun{GPUMemory: peak},
			GPU: &GPUCollision{Device: "cuda:0", MemoryChecks: []*MemCheck{{Run: "policy", Verdict: "off by more than 10%"}}}}), nil},
		{"smoke", reportJSON(t, "collision", &CollisionResults{GPU: &GPUCollision{Smoke: SmokeLabel}}), []string{"every GPU figure (" + SmokeLabel + ")"}},
	} {
		got, err := unmeasured(c.report)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %q %v\nwant %q", c.name, got, err, c.want)
		}
	}
	if _, err := unmeasured(reportJSON(t, "jobs", nil)); err == nil {
		t.Error("a report of a bench without known targets: no error")
	}
}

// TestUnmeasuredMain: `ortbus bench unmeasured STEP FILE` prints each target without a
// figure under STEP and exits 1; a complete report exits 0; an unreadable one 2.
func TestUnmeasuredMain(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	power := 1.0
	ok := write("ok.json", reportJSON(t, "profile", &ProfileResults{Services: []*ServiceProfile{{Name: "s", P95MS: 1, ItemsPerS: 1, CPUPercent: 1, MemoryIdleBytes: 1, MemoryPeakBytes: 1, PowerW: &power}}}))
	bad := write("bad.json", reportJSON(t, "profile", &ProfileResults{Services: []*ServiceProfile{{Name: "s", P95MS: 1, ItemsPerS: 1, CPUPercent: 1, MemoryIdleBytes: 1, MemoryPeakBytes: 1, PowerNote: "no nvidia-smi"}}}))
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"profile", ok}, 0, ""},
		{[]string{"profile", bad}, 1, "profile: not measured: s: power_w (no nvidia-smi)\n"},
		{[]string{"profile", filepath.Join(dir, "missing.json")}, 2, ""},
		{[]string{"profile"}, 2, ""},
	} {
		var out, errb bytes.Buffer
		if code := UnmeasuredMain(c.args, &out, &errb); code != c.code || out.String() != c.out || (code == 2) != (errb.Len() > 0) {
			t.Errorf("%q: exit %d, %q %q", c.args, code, out.String(), errb.String())
		}
	}
}
