package test

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestInferElementTypes runs infer through a real gateway and ortworker on a one-operator
// model per element type: Identity of every numeric ONNX Runtime type, shape [2,3], and
// Cast float32 -> float16 / bfloat16 (the expected bits worked out with codec's
// conversions). Each is sent inline (msgpack) and by path (.npy in and out; bfloat16 as
// ml_dtypes' '<V2', the file np.save writes for it).
func TestInferElementTypes(t *testing.T) {
	t.Parallel()
	pool := newInferPool(t)
	root, spool := pool.root, pool.spool
	types := []string{"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool"}
	for _, typ := range types {
		pool.add(t, "id-"+typ, onnxgen.IdentityGraph(onnxgen.DataTypes[typ], 2, 3))
	}
	pool.add(t, "cast-float16", onnxgen.CastGraph(onnxgen.Float, onnxgen.Float16, 2, 3))
	pool.add(t, "cast-bfloat16", onnxgen.CastGraph(onnxgen.Float, onnxgen.BFloat16, 2, 3))
	g, _ := pool.start(t, "types", testenv.RuntimeLib(t, "1.30.0"))
	shape := []int64{2, 3}
	for _, typ := range types {
		size := codec.ElemSize(typ)
		data := make([]byte, 6*size)
		for i := range data {
			data[i] = byte(37*i + 11)
		}
		if typ == "bool" {
			data = []byte{0, 1, 1, 0, 1, 0}
		}
		x := &codec.Tensor{Type: typ, Shape: shape, Data: data}
		model := "id-" + typ
		rep, err := g.infer(t, &codec.Request{Model: model, Inputs: map[string]*codec.Tensor{"x": x}})
		if err != nil {
			t.Errorf("%s inline: %s: %s", model, err.Code, err.Message)
			continue
		}
		sameTensor(t, model+" inline y", rep.Outputs["y"], x)

		xPath := filepath.Join(root, typ+".npy")
		out := filepath.Join(spool, typ)
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		writeNPY(t, xPath, x)
		if _, err := g.infer(t, &codec.Request{Model: model, InputPaths: map[string]string{"x": xPath}, OutputDir: out}); err != nil {
			t.Errorf("%s by path: %s: %s", model, err.Code, err.Message)
			continue
		}
		sameTensor(t, model+" by path y", readNPY(t, filepath.Join(out, "y.npy")), x)
	}

	xs := []float32{0, 1, -2.5, 0.1, 70000, 1.00390625}
	x := &codec.Tensor{Type: "float32", Shape: shape, Data: codec.Float32Bytes(xs)}
	for _, to := range []string{"float16", "bfloat16"} {
		want := &codec.Tensor{Type: to, Shape: shape, Data: make([]byte, 12)}
		for i, v := range xs {
			b := codec.Float16Bits(v)
			if to == "bfloat16" {
				b = codec.BFloat16Bits(v)
			}
			binary.LittleEndian.PutUint16(want.Data[2*i:], b)
		}
		rep, err := g.infer(t, &codec.Request{Model: "cast-" + to, Inputs: map[string]*codec.Tensor{"x": x}})
		if err != nil {
			t.Fatalf("cast-%s: %s: %s", to, err.Code, err.Message)
		}
		sameTensor(t, fmt.Sprintf("cast-%s y", to), rep.Outputs["y"], want)
	}
}
