package onnxgen

import (
	"bytes"
	"testing"
)

// TestDecoderGraph: the decoder's bytes are the same on every build (deterministic
// weights), its parameter count is what Params says, it has the inputs and outputs the
// tenant feeds and reads per layer, and a shape with a zero size is refused.
func TestDecoderGraph(t *testing.T) {
	spec := DecoderSpec{Layers: 2, Width: 16, FF: 64, Vocab: 32, MaxPos: 40}
	a, err := DecoderGraph(spec)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := DecoderGraph(spec)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two builds of the same decoder differ")
	}
	params := 0
	for _, in := range a.inits {
		if in.Type == Float && len(in.Dims) > 0 {
			n := 1
			for _, d := range in.Dims {
				n *= int(d)
			}
			params += n
		}
	}
	if params != spec.Params() {
		t.Errorf("%d float parameters in the graph, Params says %d", params, spec.Params())
	}
	names := func(vs []valueInfo) map[string]bool {
		m := map[string]bool{}
		for _, v := range vs {
			m[v.name] = true
		}
		return m
	}
	ins, outs := names(a.inputs), names(a.outputs)
	for _, n := range []string{"ids", "pos", "mask", "past_k_0", "past_v_0", "past_k_1", "past_v_1"} {
		if !ins[n] {
			t.Errorf("no input %s", n)
		}
	}
	for _, n := range []string{"logits", "present_k_0", "present_v_0", "present_k_1", "present_v_1"} {
		if !outs[n] {
			t.Errorf("no output %s", n)
		}
	}
	if len(ins) != 3+2*spec.Layers || len(outs) != 1+2*spec.Layers {
		t.Errorf("%d inputs and %d outputs, want %d and %d", len(ins), len(outs), 3+2*spec.Layers, 1+2*spec.Layers)
	}
	if _, err := DecoderGraph(DecoderSpec{Layers: 0, Width: 16, FF: 64, Vocab: 32, MaxPos: 40}); err == nil {
		t.Error("a decoder of 0 layers was built")
	}
	if p := DefaultDecoder.Params(); p != 17_845_248 {
		t.Errorf("the default decoder has %d parameters; its doc says 17.8 M", p)
	}
}
