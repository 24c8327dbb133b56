package test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"

	ortclient "github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestInferStringsAndOpenHalves runs infer through a real gateway and ortworker, with the
// Go client, on string tensors (Identity of a fixed and of a dynamic shape: inline in
// msgpack and JSON, and by path as NumPy '<U' files both ways) and on float16 and
// bfloat16 outputs of a symbolic shape (Cast from float32 of ["N",3]), which ortbus
// refused before (onnxruntime_go cannot copy them when the runtime allocates them).
func TestInferStringsAndOpenHalves(t *testing.T) {
	t.Parallel()
	pool := newInferPool(t)
	root, spool := pool.root, pool.spool
	pool.add(t, "id-string", onnxgen.IdentityGraph(onnxgen.String, 2, 3))
	pool.add(t, "id-string-dyn", onnxgen.IdentityGraph(onnxgen.String, "N"))
	// StringNormalizer, as ONNX's node tests test_strnormalizer_*: fewer strings out than
	// in (a stopword dropped), the output's shape fixed in the model.
	norm := onnxgen.NewGraph("strnorm")
	norm.AddInput("x", onnxgen.String, 4)
	norm.AddOutput("y", onnxgen.String, 3)
	norm.AddNode("StringNormalizer", []string{"x"}, []string{"y"}, onnxgen.AttrString("case_change_action", "NONE"),
		onnxgen.AttrInt("is_case_sensitive", 1), onnxgen.AttrStrings("stopwords", "monday"), onnxgen.AttrString("locale", "C.UTF-8"))
	pool.add(t, "strnorm", norm)
	pool.add(t, "cast-float16-dyn", onnxgen.CastGraph(onnxgen.Float, onnxgen.Float16, "N", 3))
	pool.add(t, "cast-bfloat16-dyn", onnxgen.CastGraph(onnxgen.Float, onnxgen.BFloat16, "N", 3))
	g, _ := pool.start(t, "strs", testenv.RuntimeLib(t, "1.30.0"))
	cl := ortclient.New(g.NC)
	infer := func(req codec.Request) *codec.InferReply {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), gwReplyBound)
		defer cancel()
		rep, err := cl.Infer(ctx, req)
		if err != nil {
			t.Fatalf("infer %s: %v", req.Model, err)
		}
		return rep
	}

	x := &codec.Tensor{Type: "string", Shape: []int64{2, 3}, Strings: []string{"", "héllo", "日本語 😀", "tab\there", "a", "z"}}
	sameTensor(t, "id-string inline y", infer(codec.Request{Model: "id-string", Inputs: map[string]*codec.Tensor{"x": x}}).Outputs["y"], x)
	xd := &codec.Tensor{Type: "string", Shape: []int64{4}, Strings: []string{"one", "", "three", "𝄞"}}
	sameTensor(t, "id-string-dyn inline y", infer(codec.Request{Model: "id-string-dyn", Inputs: map[string]*codec.Tensor{"x": xd}}).Outputs["y"], xd)

	days := &codec.Tensor{Type: "string", Shape: []int64{4}, Strings: []string{"monday", "tuesday", "wednesday", "thursday"}}
	kept := &codec.Tensor{Type: "string", Shape: []int64{3}, Strings: []string{"tuesday", "wednesday", "thursday"}}
	sameTensor(t, "strnorm inline y", infer(codec.Request{Model: "strnorm", Inputs: map[string]*codec.Tensor{"x": days}}).Outputs["y"], kept)

	// JSON: the data is an array of strings both ways.
	msg := nats.NewMsg("ortbus.v1.infer")
	msg.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	msg.Data = []byte(`{"model": "id-string-dyn", "inputs": {"x": {"type": "string", "shape": [2], "data": ["json \u00e9", "\ud83d\ude00"]}}}`)
	jr, err := g.NC.RequestMsg(msg, gwReplyBound)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Outputs map[string]struct {
			Type  string   `json:"type"`
			Shape []int64  `json:"shape"`
			Data  []string `json:"data"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(jr.Data, &raw); err != nil {
		t.Fatalf("JSON reply %s: %v", jr.Data, err)
	}
	if y := raw.Outputs["y"]; y.Type != "string" || !slices.Equal(y.Shape, []int64{2}) || !slices.Equal(y.Data, []string{"json é", "😀"}) {
		t.Errorf("JSON reply %s", jr.Data)
	}

	// By path: a '<U' file in, a '<U' file out.
	xPath := filepath.Join(root, "x_str.npy")
	writeNPY(t, xPath, x)
	out := filepath.Join(spool, "str")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	rep := infer(codec.Request{Model: "id-string", InputPaths: map[string]string{"x": xPath}, OutputDir: out})
	if rep.OutputPaths["y"] != filepath.Join(out, "y.npy") {
		t.Fatalf("by path: %+v", rep)
	}
	sameTensor(t, "id-string by path y", readNPY(t, filepath.Join(out, "y.npy")), x)
	outNorm := filepath.Join(spool, "strnorm")
	if err := os.Mkdir(outNorm, 0o755); err != nil {
		t.Fatal(err)
	}
	rep = infer(codec.Request{Model: "strnorm", Inputs: map[string]*codec.Tensor{"x": days}, OutputDir: outNorm})
	sameTensor(t, "strnorm by path y", readNPY(t, filepath.Join(outNorm, "y.npy")), kept)

	// A NUL byte cannot reach ONNX Runtime (a C string): bad_request, not a cut string.
	ctx, cancel := context.WithTimeout(context.Background(), gwReplyBound)
	defer cancel()
	_, err = cl.Infer(ctx, codec.Request{Model: "id-string-dyn", Inputs: map[string]*codec.Tensor{"x": {Type: "string", Shape: []int64{1}, Strings: []string{"a\x00b"}}}})
	if codec.CodeOf(err) != codec.CodeBadRequest {
		t.Errorf("NUL in a string: %v, want bad_request", err)
	}

	// float16 and bfloat16 outputs of a symbolic shape, several batch sizes.
	xs := []float32{0, 1, -2.5, 0.1, 70000, 1.00390625, 3.14159, -1e-6, 65504}
	for _, to := range []string{"float16", "bfloat16"} {
		for _, n := range []int64{1, 3} {
			in := &codec.Tensor{Type: "float32", Shape: []int64{n, 3}, Data: codec.Float32Bytes(xs[:3*n])}
			want := &codec.Tensor{Type: to, Shape: []int64{n, 3}, Data: make([]byte, 6*n)}
			for i, v := range xs[:3*n] {
				b := codec.Float16Bits(v)
				if to == "bfloat16" {
					b = codec.BFloat16Bits(v)
				}
				want.Data[2*i], want.Data[2*i+1] = byte(b), byte(b>>8)
			}
			sameTensor(t, "cast-"+to+"-dyn y", infer(codec.Request{Model: "cast-" + to + "-dyn", Inputs: map[string]*codec.Tensor{"x": in}}).Outputs["y"], want)
		}
	}
}
