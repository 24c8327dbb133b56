package ort_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

// modelWriter returns a function that writes the model g to NAME.onnx in a temporary
// directory of t and returns its path.
func modelWriter(t *testing.T) func(name string, g *onnxgen.Graph) string {
	dir := t.TempDir()
	return func(name string, g *onnxgen.Graph) string {
		p := filepath.Join(dir, name+".onnx")
		if err := g.WriteFile(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// typeSamples are six values of each element type (shape [2,3]), with the type's edges.
func typeSamples() map[string]any {
	return map[string]any{
		"float32":  []float32{0, 1, -2.5, 0.1, math.MaxFloat32, -math.SmallestNonzeroFloat32},
		"float64":  []float64{0, 1, -2.5, 0.1, math.MaxFloat64, -math.SmallestNonzeroFloat64},
		"float16":  ort.Float16{0, 0x3c00, 0xc100, 0x2e66, 0x7bff, 0x8001},
		"bfloat16": ort.BFloat16{0, 0x3f80, 0xc020, 0x3dcd, 0x7f7f, 0x8001},
		"int64":    []int64{0, 1, -1, 1 << 40, math.MinInt64, math.MaxInt64},
		"int32":    []int32{0, 1, -1, 1 << 20, math.MinInt32, math.MaxInt32},
		"int16":    []int16{0, 1, -1, 1000, math.MinInt16, math.MaxInt16},
		"int8":     []int8{0, 1, -1, 100, math.MinInt8, math.MaxInt8},
		"uint64":   []uint64{0, 1, 2, 1 << 40, 1 << 63, math.MaxUint64},
		"uint32":   []uint32{0, 1, 2, 1 << 20, 1 << 31, math.MaxUint32},
		"uint16":   []uint16{0, 1, 2, 1000, 1 << 15, math.MaxUint16},
		"uint8":    []uint8{0, 1, 2, 100, 128, 255},
		"bool":     []bool{false, true, true, false, true, false},
	}
}

// testElementTypes runs a one-operator Identity model of every element type ONNX Runtime
// has a number for: of a fixed shape [2,3] (float16 and bfloat16 outputs preallocated),
// of a dynamic batch ["N",3] (the runtime allocates the output; float16 and bfloat16
// through a float32 Cast), and of zero size [0,3]; and
// Cast from float32 to float16 and bfloat16, the expected bits worked out in Go.
func (c *child) testElementTypes(t *testing.T) {
	write := modelWriter(t)
	for typ, data := range typeSamples() {
		dt := onnxgen.DataTypes[typ]
		s := c.session(t, write(typ+"_fixed", onnxgen.IdentityGraph(dt, 2, 3)), ort.SessionConfig{})
		if len(s.Inputs) != 1 || s.Inputs[0].Type != typ || s.Outputs[0].Type != typ {
			t.Errorf("%s: inputs %+v outputs %+v", typ, s.Inputs, s.Outputs)
		}
		got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{2, 3}, Data: data}})
		wantTensor(t, got["y"], []int64{2, 3}, data)

		// A float16 or bfloat16 output of a dynamic shape comes back through a float32
		// Cast (halfcast.go; more in testHalfOpenShape).
		dyn := write(typ+"_dynamic", onnxgen.IdentityGraph(dt, "N", 3))
		ds := c.session(t, dyn, ort.SessionConfig{})
		got = outputsByName(t, ds, []ort.Tensor{{Name: "x", Shape: []int64{2, 3}, Data: data}})
		wantTensor(t, got["y"], []int64{2, 3}, data)

		s = c.session(t, write(typ+"_empty", onnxgen.IdentityGraph(dt, 0, 3)), ort.SessionConfig{})
		empty := ortSlice(data, 0)
		got = outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{0, 3}, Data: empty}})
		wantTensor(t, got["y"], []int64{0, 3}, empty)
	}

	// Cast rounds to the nearest value of the type, as codec's conversions do.
	xs := []float32{0, 1, -2.5, 0.1, 70000, 1.00390625}
	for _, to := range []string{"float16", "bfloat16"} {
		s := c.session(t, write("cast_"+to, onnxgen.CastGraph(onnxgen.Float, onnxgen.DataTypes[to], 2, 3)), ort.SessionConfig{})
		got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{2, 3}, Data: xs}})
		bits := make([]uint16, len(xs))
		for i, v := range xs {
			if to == "float16" {
				bits[i] = codec.Float16Bits(v)
			} else {
				bits[i] = codec.BFloat16Bits(v)
			}
		}
		var want any = ort.Float16(bits)
		if to == "bfloat16" {
			want = ort.BFloat16(bits)
		}
		wantTensor(t, got["y"], []int64{2, 3}, want)
	}

	// A rank-0 float16 input, which onnxruntime_go cannot make, runs through a rewritten
	// copy of the model that takes it as [1] (scalarin.go; more in testScalarInputs).
	g := onnxgen.NewGraph("half_scalar")
	g.AddInput("x", onnxgen.Float16)
	g.AddOutput("y", onnxgen.Float16, 1)
	g.AddNode("Unsqueeze", []string{"x", g.AddInt64("axes", []int64{1}, []int64{0})}, []string{"y"})
	s := c.session(t, write("half_scalar", g), ort.SessionConfig{})
	got := outputsByName(t, s, []ort.Tensor{{Name: "x", Data: ort.Float16{0x3c00}}})
	wantTensor(t, got["y"], []int64{1}, ort.Float16{0x3c00})
}

// ortSlice is data's type with n elements.
func ortSlice(data any, n int) any {
	switch data.(type) {
	case []float32:
		return make([]float32, n)
	case []float64:
		return make([]float64, n)
	case ort.Float16:
		return make(ort.Float16, n)
	case ort.BFloat16:
		return make(ort.BFloat16, n)
	case []int64:
		return make([]int64, n)
	case []int32:
		return make([]int32, n)
	case []int16:
		return make([]int16, n)
	case []int8:
		return make([]int8, n)
	case []uint64:
		return make([]uint64, n)
	case []uint32:
		return make([]uint32, n)
	case []uint16:
		return make([]uint16, n)
	case []uint8:
		return make([]uint8, n)
	case []bool:
		return make([]bool, n)
	}
	panic("ortSlice")
}
