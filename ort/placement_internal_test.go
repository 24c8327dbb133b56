package ort

import (
	"strings"
	"testing"
)

// TestParsePlacement: a profiler trace's node events counted once per node by EP (its
// fence events and session events ignored); hostile traces are errors, not panics.
func TestParsePlacement(t *testing.T) {
	trace := `[{"cat":"Session","name":"model_loading_uri","args":{}},
{"cat":"Node","name":"Mul_1_fence_before","args":{"op_name":"Mul"}},
{"cat":"Node","name":"Mul_1_kernel_time","args":{"op_name":"Mul","provider":"WebGpuExecutionProvider"}},
{"cat":"Node","name":"Mul_1_kernel_time","args":{"op_name":"Mul","provider":"WebGpuExecutionProvider"}},
{"cat":"Node","name":"Det_2_kernel_time","args":{"op_name":"Det","provider":"CPUExecutionProvider"}},
{"cat":"Node","name":"copy_kernel_time","args":{"op_name":"MemcpyFromHost","provider":"WebGpuExecutionProvider"}},
{"cat":"Node","name":"x_kernel_time","args":{"op_name":"Foo","provider":"AcmeExecutionProvider"}}]`
	p, err := parsePlacement(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	if p.NodesByEP["webgpu"] != 2 || p.NodesByEP["cpu"] != 1 || p.NodesByEP["acme"] != 1 || len(p.NodesByEP) != 3 {
		t.Errorf("nodes by EP %v", p.NodesByEP)
	}
	if off := strings.Join(p.Off("webgpu"), ","); off != "Det (cpu),Foo (acme)" {
		t.Errorf("off webgpu: %s", off)
	}
	for _, bad := range []string{"", "{", `{"cat":"Node"}`, `[{"cat":1}]`, strings.Repeat("[", 100000)} {
		if _, err := parsePlacement(strings.NewReader(bad)); err == nil {
			t.Errorf("trace %.20q: no error", bad)
		}
	}
	var sum Placement
	sum.Add(p)
	sum.Add(p)
	sum.Add(nil)
	if sum.NodesByEP["webgpu"] != 4 || len(sum.Ops["webgpu"]) != 2 {
		t.Errorf("sum %+v", sum)
	}
}
