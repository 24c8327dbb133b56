package ort

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestScalarGraph checks the rewrite of rank-0 inputs (scalarin.go) without a runtime:
// the input renamed and of shape [1], its element type kept; a Reshape to the scalar
// first among the nodes; the empty int64 shape initializer; inputs of unknown rank or of
// a fixed rank left alone; a taken name refused; and the outputs' cast of halfcast.go
// made in the same copy.
func TestScalarGraph(t *testing.T) {
	dir := t.TempDir()
	write := func(g *onnxgen.Graph) string {
		p := filepath.Join(dir, "m.onnx")
		if err := g.WriteFile(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	g := onnxgen.NewGraph("g")
	g.AddInput("a", onnxgen.Float16)
	g.AddInput("b", onnxgen.String, 2)
	g.AddInputNoShape("c", onnxgen.BFloat16)
	g.AddOutput("y", onnxgen.Float16, "N")
	g.AddNode("Identity", []string{"a"}, []string{"y"})
	model, outs, ins, err := rewriteModel(write(g), []string{"y"}, []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) != 1 || ins["a"] != "a"+rank1Suffix || outs["y"] != "y"+castSuffix {
		t.Fatalf("renamed inputs %v, outputs %v; want a alone, and y", ins, outs)
	}
	graph := subMessages(t, model, pbModelGraph)[0]
	nodes := subMessages(t, graph, pbGraphNode)
	if len(nodes) != 3 {
		t.Fatalf("%d nodes, want the Reshape, the model's Identity and the Cast", len(nodes))
	}
	if op, in, out := nodeOf(t, nodes[0]); op != "Reshape" || !slices.Equal(in, []string{"a" + rank1Suffix, scalarShapeName}) || !slices.Equal(out, []string{"a"}) {
		t.Errorf("first node %s %v -> %v, want Reshape [a%s %s] -> [a]", op, in, out, rank1Suffix, scalarShapeName)
	}
	if op, _, _ := nodeOf(t, nodes[2]); op != "Cast" {
		t.Errorf("last node %s, want the Cast of y", op)
	}
	var names []string
	for _, v := range subMessages(t, graph, pbGraphInput) {
		name, _ := valueName(v)
		names = append(names, name)
		rank0, err := declaredRank0(v)
		if err != nil || rank0 {
			t.Errorf("input %s still rank 0 (%v)", name, err)
		}
		if name == "a"+rank1Suffix {
			// TypeProto.tensor_type: elem_type FLOAT16, shape {dim {dim_value: 1}}.
			want := protowire.AppendVarint(protowire.AppendTag(nil, pbTensorTypeElem, protowire.VarintType), uint64(onnxgen.Float16))
			want = protowire.AppendTag(want, pbTensorTypeShape, protowire.BytesType)
			want = protowire.AppendBytes(want, []byte{0x0a, 0x02, 0x08, 0x01})
			var tt []byte
			if err := tensorType(v, func(b []byte) error { tt = b; return nil }); err != nil || !bytes.Equal(tt, want) {
				t.Errorf("input %s: tensor type % x, want % x", name, tt, want)
			}
		}
	}
	if !slices.Equal(names, []string{"a" + rank1Suffix, "b", "c"}) {
		t.Errorf("inputs %v", names)
	}
	inits := subMessages(t, graph, pbGraphInitializer)
	// TensorProto: dims [0], data_type INT64, the name.
	want := []byte{0x08, 0x00, 0x10, onnxInt64, 0x42, byte(len(scalarShapeName))}
	if len(inits) != 1 || !bytes.Equal(inits[0], append(want, scalarShapeName...)) {
		t.Errorf("initializers % x, want the empty int64 shape", inits)
	}

	// Nothing of rank 0: no rewrite of the inputs.
	g = onnxgen.IdentityGraph(onnxgen.Float16, 1)
	path := write(g)
	model, _, ins, err = rewriteModel(path, nil, []string{"x"})
	orig, _ := os.ReadFile(path)
	if err != nil || len(ins) != 0 || !bytes.Equal(model, orig) {
		t.Errorf("an input of rank 1: renamed %v, err %v, changed %v", ins, err, !bytes.Equal(model, orig))
	}

	// A name the rewrite would add is taken.
	for _, taken := range []string{scalarShapeName, "x" + rank1Suffix} {
		g = onnxgen.NewGraph("taken")
		g.AddInput("x", onnxgen.String)
		g.AddOutput("y", onnxgen.String)
		g.AddOutput(taken, onnxgen.String)
		g.AddNode("Identity", []string{"x"}, []string{"y"})
		g.AddNode("Identity", []string{"x"}, []string{taken})
		if _, _, _, err := rewriteModel(write(g), nil, []string{"x"}); err == nil || !strings.Contains(err.Error(), taken) {
			t.Errorf("%s taken: %v, want an error naming it", taken, err)
		}
	}
}

// subMessages are the length-delimited fields num of the message b.
func subMessages(t *testing.T, b []byte, num protowire.Number) [][]byte {
	t.Helper()
	var out [][]byte
	if err := fields(b, func(n protowire.Number, typ protowire.Type, _, val []byte) error {
		if n == num && typ == protowire.BytesType {
			out = append(out, val)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// nodeOf is a NodeProto's op_type, inputs and outputs.
func nodeOf(t *testing.T, b []byte) (op string, in, out []string) {
	t.Helper()
	if err := fields(b, func(n protowire.Number, typ protowire.Type, _, val []byte) error {
		switch n {
		case pbNodeOpType:
			op = string(val)
		case pbNodeInput:
			in = append(in, string(val))
		case pbNodeOutput:
			out = append(out, string(val))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return op, in, out
}
