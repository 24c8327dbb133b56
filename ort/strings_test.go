package ort_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

// testStrings runs string tensors in and out: Identity of a fixed, a dynamic and a
// zero-size shape (the runtime allocates the output), Concat of two string inputs of
// dynamic shapes, a rank-0 string output (Squeeze), a rank-0 string input (which
// onnxruntime_go cannot make: through a rewritten model), and the refusal of a NUL byte in
// an input (a C string would be cut short) with bad_request.
func (c *child) testStrings(t *testing.T) {
	write := modelWriter(t)
	strs := []string{"", "héllo", "日本語 😀", strings.Repeat("long ", 1000), "a", "tab\tnew\nline"}
	for _, dims := range [][]any{{2, 3}, {"N", 3}} {
		s := c.session(t, write("id_string", onnxgen.IdentityGraph(onnxgen.String, dims...)), ort.SessionConfig{})
		if s.Inputs[0].Type != "string" || s.Outputs[0].Type != "string" || !s.Returns("y") {
			t.Fatalf("string model: inputs %+v outputs %+v", s.Inputs, s.Outputs)
		}
		for range 2 {
			got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{2, 3}, Data: strs}})
			wantTensor(t, got["y"], []int64{2, 3}, strs)
		}
	}
	s := c.session(t, write("id_string_empty", onnxgen.IdentityGraph(onnxgen.String, 0, 3)), ort.SessionConfig{})
	got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{0, 3}, Data: []string{}}})
	wantTensor(t, got["y"], []int64{0, 3}, []string{})

	g := onnxgen.NewGraph("string_concat")
	g.AddInput("a", onnxgen.String, "N", 2)
	g.AddInput("b", onnxgen.String, "M", 2)
	g.AddOutput("ab", onnxgen.String, "K", 2)
	g.AddNode("Concat", []string{"a", "b"}, []string{"ab"}, onnxgen.AttrInt("axis", 0))
	s = c.session(t, write("string_concat", g), ort.SessionConfig{})
	got = outputsByName(t, s, []ort.Tensor{
		{Name: "a", Shape: []int64{1, 2}, Data: []string{"é", "x"}},
		{Name: "b", Shape: []int64{2, 2}, Data: []string{"", "same", "日本", "!"}},
	})
	wantTensor(t, got["ab"], []int64{3, 2}, []string{"é", "x", "", "same", "日本", "!"})

	g = onnxgen.NewGraph("string_scalar_out")
	g.AddInput("x", onnxgen.String, 1)
	g.AddOutput("y", onnxgen.String)
	g.AddNode("Squeeze", []string{"x", g.AddInt64("axes", []int64{1}, []int64{0})}, []string{"y"})
	s = c.session(t, write("string_scalar_out", g), ort.SessionConfig{})
	for range 2 {
		got = outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{1}, Data: []string{"only one"}}})
		wantTensor(t, got["y"], []int64{}, []string{"only one"})
	}

	// StringNormalizer (as ONNX's node tests test_strnormalizer_*): the output has fewer
	// strings than the input (a stopword dropped), its shape fixed in the model or open.
	for _, out := range [][]any{{3}, {"M"}} {
		g = onnxgen.NewGraph("string_normalizer")
		g.AddInput("x", onnxgen.String, 4)
		g.AddOutput("y", onnxgen.String, out...)
		g.AddNode("StringNormalizer", []string{"x"}, []string{"y"}, onnxgen.AttrString("case_change_action", "NONE"),
			onnxgen.AttrInt("is_case_sensitive", 1), onnxgen.AttrStrings("stopwords", "monday"), onnxgen.AttrString("locale", "C.UTF-8"))
		s = c.session(t, write("string_normalizer", g), ort.SessionConfig{})
		for range 2 {
			got = outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{4}, Data: []string{"monday", "tuesday", "wednesday", "thursday"}}})
			wantTensor(t, got["y"], []int64{3}, []string{"tuesday", "wednesday", "thursday"})
		}
	}

	s = c.session(t, write("id_string_dyn", onnxgen.IdentityGraph(onnxgen.String, "N")), ort.SessionConfig{})
	_, err := s.Run(context.Background(), []ort.Tensor{{Name: "x", Shape: []int64{2}, Data: []string{"ok", "a\x00b"}}})
	if codec.CodeOf(err) != codec.CodeBadRequest || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("NUL in a string input: %v, want bad_request", err)
	}
	// A rank-0 string input runs through a rewritten copy of the model (scalarin.go).
	g = onnxgen.NewGraph("string_scalar_in")
	g.AddInput("x", onnxgen.String)
	g.AddOutput("y", onnxgen.String, 1)
	g.AddNode("Unsqueeze", []string{"x", g.AddInt64("axes", []int64{1}, []int64{0})}, []string{"y"})
	s = c.session(t, write("string_scalar_in", g), ort.SessionConfig{})
	got = outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{}, Data: []string{"x"}}})
	wantTensor(t, got["y"], []int64{1}, []string{"x"})
}

// testHalfOpenShape runs float16 and bfloat16 outputs whose shape the model leaves open —
// a symbolic dimension, an unknown rank, rank 0 — which the runtime allocates and
// onnxruntime_go cannot copy: the session fetches them through a Cast to float32 in a
// rewritten copy of the model (halfcast.go). Every value comes back with its exact bits:
// Cast from float32 (rounded as codec rounds), Identity of every edge of the types (NaN,
// infinities, subnormals, the largest), for several batch sizes on one session.
func (c *child) testHalfOpenShape(t *testing.T) {
	write := modelWriter(t)
	xs := []float32{0, 1, -2.5, 0.1, 70000, 1.00390625, float32(math.Inf(-1)), 3.14159, -1e-6}
	for _, to := range []string{"float16", "bfloat16"} {
		bits := func(v []float32) any {
			b := make([]uint16, len(v))
			for i, x := range v {
				if to == "float16" {
					b[i] = codec.Float16Bits(x)
				} else {
					b[i] = codec.BFloat16Bits(x)
				}
			}
			if to == "float16" {
				return ort.Float16(b)
			}
			return ort.BFloat16(b)
		}
		dt := onnxgen.DataTypes[to]
		s := c.session(t, write("cast_dyn_"+to, onnxgen.CastGraph(onnxgen.Float, dt, "N", 3)), ort.SessionConfig{})
		if !s.Returns("y") || s.Outputs[0].Type != to || s.Outputs[0].Name != "y" {
			t.Fatalf("%s: outputs %+v", to, s.Outputs)
		}
		for _, n := range []int{3, 1, 2, 0} {
			got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{int64(n), 3}, Data: xs[:3*n]}})
			wantTensor(t, got["y"], []int64{int64(n), 3}, bits(xs[:3*n]))
		}

		edges := ort.Float16{0, 0x8000, 0x3c00, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x7c00, 0xfc00, 0x7e00, 0x7e01}
		var data any = edges
		if to == "bfloat16" {
			data = ort.BFloat16{0, 0x8000, 0x3f80, 0x7f7f, 0xff7f, 0x0001, 0x8001, 0x007f, 0x7f80, 0xff80, 0x7fc0, 0x7fc1}
		}
		s = c.session(t, write("id_dyn_"+to, onnxgen.IdentityGraph(dt, "N", "M")), ort.SessionConfig{})
		got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{3, 4}, Data: data}})
		wantTensor(t, got["y"], []int64{3, 4}, data)

		// Rank 0, and an output whose rank the model does not say.
		s = c.session(t, write("cast_scalar_"+to, onnxgen.CastGraph(onnxgen.Float, dt)), ort.SessionConfig{})
		for range 2 {
			got = outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{}, Data: []float32{0.1}}})
			wantTensor(t, got["y"], []int64{}, bits([]float32{0.1}))
		}
		g := onnxgen.NewGraph("cast_norank_" + to)
		g.AddInput("x", onnxgen.Float, "N")
		g.AddOutputNoShape("y", dt)
		g.AddNode("Cast", []string{"x"}, []string{"y"}, onnxgen.AttrInt("to", int64(dt)))
		s = c.session(t, write("cast_norank_"+to, g), ort.SessionConfig{})
		got = outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{2}, Data: xs[:2]}})
		wantTensor(t, got["y"], []int64{2}, bits(xs[:2]))
	}
}
