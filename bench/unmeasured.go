package bench

// Not measured is not a pass (issue 41, item 3): scripts/gpu-check.sh holds each report
// of a step against the figures its targets need, and fails every one that is absent,
// named: a bench that skipped a path, a run that never happened, a reading that was not
// there. A figure that was measured but misses its target is the bench's own "target
// missed" note; this is about the ones with no figure at all. The reports are read as
// JSON (gpu-check reads the files), so a report's shape is what is checked.

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
)

// unmeasured lists the targets of report (a bench's JSON report) that have no figure,
// each "TARGET (why)". A run without a GPU (a smoke) has none of a GPU's figures: that
// is one entry.
func unmeasured(report []byte) ([]string, error) {
	var rep struct {
		Bench   string         `json:"bench"`
		Results map[string]any `json:"results"`
	}
	if err := json.Unmarshal(report, &rep); err != nil {
		return nil, err
	}
	r := jsonObj(rep.Results)
	if smoke := r.obj("gpu").str("smoke"); smoke != "" {
		return []string{"every GPU figure (" + smoke + ")"}, nil
	}
	switch rep.Bench {
	case "throughput":
		return throughputUnmeasured(r), nil
	case "profile":
		return profileUnmeasured(r), nil
	case "collision":
		return collisionUnmeasured(r), nil
	}
	return nil, fmt.Errorf("no targets known for a %q report", rep.Bench)
}

// throughputUnmeasured: each model's system / in-process ratio, and its system /
// onnxruntime-node ratio (on webgpu: issue 31's targets).
func throughputUnmeasured(r jsonObj) []string {
	var out []string
	if w := r.obj("setup").obj("webgpu"); w != nil && w.str("smoke") != "" {
		return []string{"every GPU figure (" + w.str("smoke") + ")"}
	}
	ratios := r.obj("ratios")
	if len(ratios) == 0 {
		return []string{"every model's throughput (no model measured)"}
	}
	skipped := r.obj("setup").obj("node").str("skipped")
	for _, m := range slices.Sorted(maps.Keys(ratios)) {
		x := ratios.obj(m)
		if x.num("system_over_inprocess") <= 0 && x.num("system_batched_over_inprocess") <= 0 {
			out = append(out, m+": the system against the in-process loop (no ratio)")
		}
		if x.num("system_over_node") <= 0 && x.num("system_batched_over_node") <= 0 {
			out = append(out, m+": the system against onnxruntime-node ("+orDefault(skipped, "no ratio")+")")
		}
	}
	return out
}

// profileUnmeasured: each service's p95, items/s, CPU %, idle and peak memory, power
// (issue 41, item 5).
func profileUnmeasured(r jsonObj) []string {
	services := r.list("services")
	if len(services) == 0 {
		return []string{"every service (none profiled)"}
	}
	var out []string
	for _, s := range services {
		name := s.str("name")
		for _, k := range []string{"p95_ms", "items_per_s", "cpu_percent", "memory_idle_bytes", "memory_peak_bytes"} {
			if s.num(k) <= 0 {
				out = append(out, fmt.Sprintf("%s: %s (no figure)", name, k))
			}
		}
		if _, ok := s["power_w"]; !ok {
			out = append(out, fmt.Sprintf("%s: power_w (%s)", name, orDefault(s.str("power_note"), "no reading")))
		}
	}
	return out
}

// collisionUnmeasured: on the GPU, the runs issue 32's targets are judged on (solo, the
// policy run, the gated run and the tenant's figures with an LLM tenant, the degrade
// run), the GPU's peak memory in the policy run, and every memory check.
func collisionUnmeasured(r jsonObj) []string {
	var out []string
	sc := r.obj("scenario")
	need := map[string]bool{"solo": true, "policy": true}
	if sc.obj("tenant") != nil {
		need["policy_gate"] = true
	}
	if sc.obj("degrade") != nil {
		need["degrade_run"] = true
	}
	for _, k := range slices.Sorted(maps.Keys(need)) {
		if r.obj(k) == nil {
			out = append(out, fmt.Sprintf("the %s run (absent)", k))
		}
	}
	if sc.obj("tenant") != nil && r.obj("ratios").obj("llm") == nil {
		out = append(out, "the llm tenant's tokens/s and first token against solo (absent)")
	}
	gpu := r.obj("gpu")
	if gpu == nil {
		return out
	}
	if r.obj("policy") != nil && r.obj("policy").obj("gpu_memory").num("samples") <= 0 {
		out = append(out, "the GPU's peak memory in the policy run ("+orDefault(r.obj("policy").obj("gpu_memory").str("reading"), "no reading")+")")
	}
	checks := gpu.list("memory_checks")
	if len(checks) == 0 {
		out = append(out, "the workers' device memory against the device's (no check)")
	}
	for _, c := range checks {
		if v := c.str("verdict"); v != "ok" && !isOff(v) {
			out = append(out, fmt.Sprintf("%s: the workers' device memory against the device's (%s)", c.str("run"), v))
		}
	}
	return out
}

func isOff(verdict string) bool { return len(verdict) > 3 && verdict[:3] == "off" }

// jsonObj is a decoded JSON object, read leniently: a missing or mistyped member is
// the zero value.
type jsonObj map[string]any

func (o jsonObj) obj(k string) jsonObj {
	if m, ok := o[k].(map[string]any); ok {
		return m
	}
	return nil
}

func (o jsonObj) str(k string) string {
	s, _ := o[k].(string)
	return s
}

func (o jsonObj) num(k string) float64 {
	f, _ := o[k].(float64)
	return f
}

func (o jsonObj) list(k string) []jsonObj {
	l, _ := o[k].([]any)
	var out []jsonObj
	for _, x := range l {
		if m, ok := x.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// UnmeasuredMain is `ortbus bench unmeasured STEP REPORT.json` (scripts/gpu-check.sh): it
// prints "STEP: not measured: TARGET (why)" for each target of the report without a
// figure, and exits 1 when there is one, 2 when the report cannot be read.
func UnmeasuredMain(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: ortbus bench unmeasured STEP REPORT.json")
		return 2
	}
	b, err := os.ReadFile(args[1])
	var missing []string
	if err == nil {
		missing, err = unmeasured(b)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ortbus bench unmeasured: %s: %v\n", args[1], err)
		return 2
	}
	for _, m := range missing {
		fmt.Fprintf(stdout, "%s: not measured: %s\n", args[0], m)
	}
	if len(missing) > 0 {
		return 1
	}
	return 0
}
