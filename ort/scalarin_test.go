package ort_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

// testScalarInputs runs rank-0 float16, bfloat16 and string inputs, which onnxruntime_go
// cannot make, through the copy of the model rewritten in memory that takes each as [1]
// and reshapes it to a scalar (scalarin.go): Identity to a rank-0 output (the shape given
// as [] or left nil); a model where such scalars meet a tensor of open shape (Concat, its
// float16 output also cast to float32 by halfcast.go) beside a numeric scalar the
// rewrite leaves alone; an input of unknown rank, which is not rewritten (any rank runs,
// but a scalar is refused, as before); a value of another shape given for a rewritten
// input (bad_request, as the runtime refuses a wrong rank); and the fallback: a model the
// rewrite cannot be made for (a name it would add is taken) still loads, its rank-0 half
// input refused with bad_request as before.
func (c *child) testScalarInputs(t *testing.T) {
	write := modelWriter(t)
	samples := map[string][]any{
		"float16":  {ort.Float16{0x3c00}, ort.Float16{0x7e01}, ort.Float16{0x8001}, ort.Float16{0xfc00}},
		"bfloat16": {ort.BFloat16{0x3f80}, ort.BFloat16{0x7fc1}, ort.BFloat16{0x8001}, ort.BFloat16{0x7f7f}},
		"string":   {[]string{""}, []string{"héllo"}, []string{"日本語 😀"}, []string{strings.Repeat("long ", 100)}},
	}
	for typ, values := range samples {
		dt := onnxgen.DataTypes[typ]
		s := c.session(t, write("id_scalar_"+typ, onnxgen.IdentityGraph(dt)), ort.SessionConfig{})
		if len(s.Inputs) != 1 || s.Inputs[0].Name != "x" || len(s.Inputs[0].Shape) != 0 || s.Inputs[0].Type != typ {
			t.Errorf("%s: inputs %+v, want the model's own x, rank 0", typ, s.Inputs)
		}
		for i, v := range values {
			var shape []int64
			if i%2 == 0 {
				shape = []int64{}
			}
			got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: shape, Data: v}})
			wantTensor(t, got["y"], []int64{}, v)
		}
		// Another shape for a scalar input: refused, as the runtime refuses a wrong rank.
		_, err := s.Run(context.Background(), []ort.Tensor{{Name: "x", Shape: []int64{1}, Data: values[0]}})
		if codec.CodeOf(err) != codec.CodeBadRequest || !strings.Contains(err.Error(), "rank-0") {
			t.Errorf("%s: shape [1] for a rank-0 input: %v, want bad_request", typ, err)
		}
	}

	// Scalars with a tensor of open shape: ab = Concat(Unsqueeze(a), b) (float16 ["M"],
	// fetched through halfcast's float32 Cast), s = Concat(Unsqueeze(p), q) (string ["K"]),
	// and k, an int64 scalar made the plain way, through Identity.
	g := onnxgen.MixedScalarsGraph("scalars_mixed")
	s := c.session(t, write("scalars_mixed", g), ort.SessionConfig{})
	for _, n := range []int{2, 0} {
		b, q := ort.Float16{0x4000, 0xc400}[:n], []string{"b0", "b1"}[:n]
		got := outputsByName(t, s, []ort.Tensor{
			{Name: "a", Data: ort.Float16{0x3c00}},
			{Name: "b", Shape: []int64{int64(n)}, Data: b},
			{Name: "p", Shape: []int64{}, Data: []string{"a"}},
			{Name: "q", Shape: []int64{int64(n)}, Data: q},
			{Name: "k", Shape: []int64{}, Data: []int64{-7}},
		})
		wantTensor(t, got["ab"], []int64{int64(n) + 1}, append(ort.Float16{0x3c00}, b...))
		wantTensor(t, got["pq"], []int64{int64(n) + 1}, append([]string{"a"}, q...))
		wantTensor(t, got["k2"], []int64{}, []int64{-7})
	}

	// An input of unknown rank is left as it is: a tensor of any rank runs; a scalar is
	// refused, as before (the model does not say it is one).
	g = onnxgen.NewGraph("half_norank_in")
	g.AddInputNoShape("x", onnxgen.Float16)
	g.AddOutputNoShape("y", onnxgen.Float16)
	g.AddNode("Identity", []string{"x"}, []string{"y"})
	s = c.session(t, write("half_norank_in", g), ort.SessionConfig{})
	got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{2, 1}, Data: ort.Float16{0x3c00, 0x4000}}})
	wantTensor(t, got["y"], []int64{2, 1}, ort.Float16{0x3c00, 0x4000})
	_, err := s.Run(context.Background(), []ort.Tensor{{Name: "x", Shape: []int64{}, Data: ort.Float16{0x3c00}}})
	if codec.CodeOf(err) != codec.CodeBadRequest || !strings.Contains(err.Error(), "rank-0") {
		t.Errorf("rank-0 value for an input of unknown rank: %v, want bad_request", err)
	}

	// The fallback: the rewrite's shape initializer's name is taken, so no copy is made;
	// the model loads as it is and its rank-0 float16 input is refused, as before.
	g = onnxgen.NewGraph("half_scalar_taken")
	g.AddInput("x", onnxgen.Float16)
	g.AddOutput("y", onnxgen.Float16, 1)
	g.AddNode("Unsqueeze", []string{"x", g.AddInt64("ortbus_scalar_shape", []int64{1}, []int64{0})}, []string{"y"})
	s = c.session(t, write("half_scalar_taken", g), ort.SessionConfig{})
	_, err = s.Run(context.Background(), []ort.Tensor{{Name: "x", Data: ort.Float16{0x3c00}}})
	if codec.CodeOf(err) != codec.CodeBadRequest || !strings.Contains(err.Error(), "rank-0") {
		t.Errorf("rank-0 float16 input without the rewrite: %v, want bad_request", err)
	}
}
