package test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestInferElementTypes runs infer through a real gateway and ortworker on a one-operator
// model per element type: Identity of every numeric ONNX Runtime type, shape [2,3], and
// Cast float32 -> float16 / bfloat16 (the expected bits worked out with codec's
// conversions). Each is sent inline (msgpack) and by path (.npy in and out); bfloat16,
// which NumPy has no dtype for, comes back inline and is refused with bad_request when
// asked for as a file.
func TestInferElementTypes(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	spool := filepath.Join(root, "spool")
	if err := os.Mkdir(spool, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	models := map[string]*config.Model{}
	var order []string
	add := func(name string, g *onnxgen.Graph) {
		d := filepath.Join(dir, name)
		if err := g.WriteFile(filepath.Join(d, onnxgen.ModelFile)); err != nil {
			t.Fatal(err)
		}
		models[name] = &config.Model{Kind: config.KindRaw, Dir: d}
		order = append(order, name)
	}
	types := []string{"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool"}
	for _, typ := range types {
		add("id-"+typ, onnxgen.IdentityGraph(onnxgen.DataTypes[typ], 2, 3))
	}
	add("cast-float16", onnxgen.CastGraph(onnxgen.Float, onnxgen.Float16, 2, 3))
	add("cast-bfloat16", onnxgen.CastGraph(onnxgen.Float, onnxgen.BFloat16, 2, 3))
	dur := func(d time.Duration) config.Duration { return config.Duration(d) }
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: dur(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: dur(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}, SpoolDir: spool},
		Classes:  map[string]*config.Class{"interactive": {Chain: []string{"types"}}},
		Pools: map[string]*config.Pool{"types": {Runtime: testenv.RuntimeLib(t, "1.30.0"), Threads: 1,
			Classes: []string{"interactive"}, Models: order}},
		Models: models,
	}
	c.SetOrder("models", order...)
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	g.waitLive(t, "types", 1)

	infer := func(req *codec.Request) (*codec.InferReply, *codec.Error) {
		t.Helper()
		r := g.call(t, "infer", req, gwReplyBound)
		if r.Err != nil {
			return nil, r.Err
		}
		var rep codec.InferReply
		if err := codec.Unmarshal(r.Msg.Data, &rep); err != nil {
			t.Fatal(err)
		}
		return &rep, nil
	}
	check := func(what string, got, want *codec.Tensor) {
		t.Helper()
		if got == nil || got.Type != want.Type || !slices.Equal(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("%s = %+v, want %+v", what, got, want)
		}
	}
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
		rep, err := infer(&codec.Request{Model: model, Inputs: map[string]*codec.Tensor{"x": x}})
		if err != nil {
			t.Errorf("%s inline: %s: %s", model, err.Code, err.Message)
			continue
		}
		check(model+" inline y", rep.Outputs["y"], x)

		xPath := filepath.Join(root, typ+".npy")
		out := filepath.Join(spool, typ)
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		if typ == "bfloat16" {
			// No .npy dtype: asking for a bfloat16 output as a file is refused before the run.
			_, err := infer(&codec.Request{Model: model, Inputs: map[string]*codec.Tensor{"x": x}, OutputDir: out})
			if err == nil || err.Code != codec.CodeBadRequest {
				t.Errorf("bfloat16 output to a file: %+v, want bad_request", err)
			}
			continue
		}
		writeNPY(t, xPath, x)
		if _, err := infer(&codec.Request{Model: model, InputPaths: map[string]string{"x": xPath}, OutputDir: out}); err != nil {
			t.Errorf("%s by path: %s: %s", model, err.Code, err.Message)
			continue
		}
		check(model+" by path y", readNPY(t, filepath.Join(out, "y.npy")), x)
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
		rep, err := infer(&codec.Request{Model: "cast-" + to, Inputs: map[string]*codec.Tensor{"x": x}})
		if err != nil {
			t.Fatalf("cast-%s: %s: %s", to, err.Code, err.Message)
		}
		check(fmt.Sprintf("cast-%s y", to), rep.Outputs["y"], want)
	}
}
