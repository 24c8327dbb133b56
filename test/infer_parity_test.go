package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// parityTypes are every element type of the contract.
var parityTypes = []string{"float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
	"uint8", "uint16", "uint32", "uint64", "bool", "string"}

// parityCase is one request of TestInferMatchesDirectRuntime.
type parityCase struct {
	label  string
	model  string
	inputs map[string]*codec.Tensor
	echo   map[string]string // outputs that must also equal an input (output -> input: an Identity)
}

// TestInferMatchesDirectRuntime: for every model the runtime itself runs correctly, infer
// returns the same outputs, inline and by path. Generated models cover every element
// type — Identity of a symbolic shape (the runtime allocates the output; float16 and
// bfloat16 through halfcast's float32 Cast; also run with zero rows), Identities of fixed
// shapes in one model (preallocated outputs): [2,3], a zero-size [0,3], and rank 0 in and
// out (float16, bfloat16 and string inputs through scalarin's rewrite), and Cast from
// float32 to the type —, float16 and bfloat16 outputs of unknown rank
// and of rank 0, a model without inputs (Constant and Cast to every type, scalars and a
// zero-size tensor among them), and scalars of those types beside tensors of open shape.
// Each runs through a real gateway and ortworker inline (msgpack) and by path (.npy in,
// .npy out; bfloat16 as ml_dtypes' '<V2'), and every output is compared,
// name, type, shape and bytes, with what the runtime gives for the same input files in a
// child process of its own (internal/testkit/ortrun: package ort alone, without the bus).
func TestInferMatchesDirectRuntime(t *testing.T) {
	t.Parallel()
	pool := newInferPool(t)
	root, spool := pool.root, pool.spool
	lib := testenv.RuntimeLib(t, "1.30.0")
	oracle := buildOracle(t)

	// One pool of 48 models: a worker's heartbeat lists at most 64 (maxList of
	// health/tracker.go; the gateway drops one that lists more, so the pool never goes
	// live), hence the fixed shapes share a model per type.
	var cases []parityCase
	one := func(label, model string, echo bool, x *codec.Tensor) {
		c := parityCase{label: label, model: model, inputs: map[string]*codec.Tensor{"x": x}}
		if echo {
			c.echo = map[string]string{"y": "x"}
		}
		cases = append(cases, c)
	}
	casts := []float32{0, 1, 2.5, 0.1, 100, 3.75} // in the range of every type
	for k, typ := range parityTypes {
		dt := onnxgen.DataTypes[typ]
		pool.add(t, "id-"+typ, onnxgen.IdentityGraph(dt, "N", 3))
		one("id-"+typ, "id-"+typ, true, paritySample(typ, []int64{2, 3}, k))
		one("id-"+typ+" zero-size", "id-"+typ, true, paritySample(typ, []int64{0, 3}, k))
		pool.add(t, "fixed-"+typ, parityFixedGraph(dt))
		cases = append(cases, parityCase{label: "fixed-" + typ, model: "fixed-" + typ, inputs: map[string]*codec.Tensor{
			"x": paritySample(typ, []int64{2, 3}, k+1), "e": paritySample(typ, []int64{0, 3}, k), "s": paritySample(typ, []int64{}, k+2),
		}, echo: map[string]string{"y": "x", "z": "e", "w": "s"}})
		pool.add(t, "cast-"+typ, onnxgen.CastGraph(onnxgen.Float, dt, "N", 3))
		one("cast-"+typ, "cast-"+typ, false, &codec.Tensor{Type: "float32", Shape: []int64{2, 3}, Data: codec.Float32Bytes(casts)})
	}
	halfIn := []float32{0, 1, -2.5, 0.1, 70000, 1.00390625, 3.14159, -1e-6}
	for _, to := range []string{"float16", "bfloat16"} {
		dt := onnxgen.DataTypes[to]
		g := onnxgen.NewGraph("cast_norank_" + to)
		g.AddInput("x", onnxgen.Float, "N")
		g.AddOutputNoShape("y", dt)
		g.AddNode("Cast", []string{"x"}, []string{"y"}, onnxgen.AttrInt("to", int64(dt)))
		pool.add(t, "cast-norank-"+to, g)
		one("cast-norank-"+to, "cast-norank-"+to, false, &codec.Tensor{Type: "float32", Shape: []int64{8}, Data: codec.Float32Bytes(halfIn)})
		pool.add(t, "cast-scalar-"+to, onnxgen.CastGraph(onnxgen.Float, dt))
		one("cast-scalar-"+to, "cast-scalar-"+to, false, &codec.Tensor{Type: "float32", Shape: []int64{}, Data: codec.Float32Bytes(halfIn[3:4])})
	}
	pool.add(t, "noinputs", parityNoInputsGraph(casts))
	cases = append(cases, parityCase{label: "noinputs", model: "noinputs", inputs: map[string]*codec.Tensor{}})
	pool.add(t, "mixed", parityMixedGraph())
	for _, n := range []int64{2, 0} {
		cases = append(cases, parityCase{label: fmt.Sprintf("mixed n=%d", n), model: "mixed", inputs: map[string]*codec.Tensor{
			"a": paritySample("float16", []int64{}, 3), "b": paritySample("float16", []int64{n}, 4),
			"p": paritySample("string", []int64{}, 5), "q": paritySample("string", []int64{n}, 6),
			"k": paritySample("int64", []int64{}, 7),
		}})
	}

	// The input files: each case's in root/<i>/ (the by-path requests read them, the
	// oracle too).
	spec := struct {
		Runs []parityRun `json:"runs"`
	}{}
	oracleOut := t.TempDir()
	for i, c := range cases {
		in := filepath.Join(root, fmt.Sprint(i))
		out := filepath.Join(oracleOut, fmt.Sprint(i))
		for _, d := range []string{in, out, filepath.Join(spool, fmt.Sprint(i))} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		run := parityRun{Model: pool.files[c.model], Inputs: map[string]parityInput{}, Out: out}
		for name, x := range c.inputs {
			p := filepath.Join(in, name+".npy")
			writeNPY(t, p, x)
			run.Inputs[name] = parityInput{Path: p}
		}
		spec.Runs = append(spec.Runs, run)
	}
	specPath := filepath.Join(oracleOut, "spec.json")
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(specPath, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// The direct runs, in a child process, while the gateway and its worker start.
	direct := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, oracle, "-lib", lib, "-spec", specPath).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%s: %v\n%s", oracle, err, out)
		}
		direct <- err
	}()

	g, live := pool.start(t, "parity", lib)
	for _, w := range live {
		for _, m := range w.Models {
			if m.State != codec.ModelReady || m.WarmupError != "" {
				t.Errorf("model %s: %+v, want ready and warmed up", m.Name, m)
			}
		}
	}
	if err := <-direct; err != nil {
		t.Fatal(err)
	}

	for i, c := range cases {
		// The direct run's outputs.
		out := filepath.Join(oracleOut, fmt.Sprint(i))
		if e, err := os.ReadFile(filepath.Join(out, "error.txt")); err == nil {
			t.Errorf("%s: the direct run failed: %s", c.label, e)
			continue
		}
		var listed []parityOutput
		if b, err := os.ReadFile(filepath.Join(out, "outputs.json")); err != nil || json.Unmarshal(b, &listed) != nil || len(listed) == 0 {
			t.Errorf("%s: the direct run wrote no outputs (%v)", c.label, err)
			continue
		}
		want := map[string]*codec.Tensor{}
		var files []string // the outputs, each of which the by-path request asks for as a file
		for _, o := range listed {
			x := readNPY(t, o.File)
			files = append(files, o.Name)
			if x.Type != o.Type || !slices.Equal(x.Shape, o.Shape) {
				t.Fatalf("%s: %s holds %s %v, listed as %s %v", c.label, o.File, x.Type, x.Shape, o.Type, o.Shape)
			}
			want[o.Name] = x
		}
		for o, in := range c.echo {
			sameTensor(t, c.label+": the direct run's "+o, want[o], c.inputs[in])
		}

		// Inline.
		rep, e := g.infer(t, &codec.Request{Model: c.model, Inputs: c.inputs})
		if e != nil {
			t.Errorf("%s inline: %s: %s", c.label, e.Code, e.Message)
			continue
		}
		if len(rep.Outputs) != len(want) {
			t.Errorf("%s inline: outputs %v, want those of the direct run (%d)", c.label, slices.Sorted(maps.Keys(rep.Outputs)), len(want))
		}
		for name, w := range want {
			sameTensor(t, c.label+" inline "+name, rep.Outputs[name], w)
		}

		// By path: every input from its file, every output to a file.
		if len(files) == 0 {
			continue
		}
		req := &codec.Request{Model: c.model, InputPaths: map[string]string{}, OutputDir: filepath.Join(spool, fmt.Sprint(i))}
		for name := range c.inputs {
			req.InputPaths[name] = filepath.Join(root, fmt.Sprint(i), name+".npy")
		}
		rep, e = g.infer(t, req)
		if e != nil {
			t.Errorf("%s by path: %s: %s", c.label, e.Code, e.Message)
			continue
		}
		if len(rep.OutputPaths) != len(files) || len(rep.Outputs) != 0 {
			t.Errorf("%s by path: output_paths %v, outputs %d; want %v as files alone", c.label, rep.OutputPaths, len(rep.Outputs), files)
		}
		for _, name := range files {
			p := filepath.Join(req.OutputDir, name+".npy")
			if rep.OutputPaths[name] != p {
				t.Errorf("%s by path: output %s at %q, want %s", c.label, name, rep.OutputPaths[name], p)
				continue
			}
			sameTensor(t, c.label+" by path "+name, readNPY(t, p), want[name])
		}
	}
	t.Logf("%d cases on %d models, each compared with a direct run", len(cases), len(pool.order))
}

// parityRun, parityInput and parityOutput are internal/testkit/ortrun's spec and outputs.json.
type parityRun struct {
	Model  string                 `json:"model"`
	Inputs map[string]parityInput `json:"inputs"`
	Out    string                 `json:"out"`
}

type parityInput struct {
	Path string `json:"path"`
}

type parityOutput struct {
	Name  string  `json:"name"`
	Type  string  `json:"type"`
	Shape []int64 `json:"shape"`
	File  string  `json:"file"`
}

// buildOracle builds internal/testkit/ortrun (without -race) into a temporary directory.
func buildOracle(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ortrun")
	build := exec.Command("go", "build", "-o", p, "./internal/testkit/ortrun")
	build.Dir = testenv.RepoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./internal/testkit/ortrun: %v\n%s", err, out)
	}
	return p
}

// paritySample is a tensor of type typ and shape, its elements drawn from seed: bytes of
// a fixed pattern for the numeric types (float edges, NaNs and infinities among them),
// 0 and 1 for bool, strings of several scripts.
func paritySample(typ string, shape []int64, seed int) *codec.Tensor {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	x := &codec.Tensor{Type: typ, Shape: shape}
	switch typ {
	case "string":
		pool := []string{"", "héllo", "日本語 😀", "tab\tnew\nline", strings.Repeat("long ", 50), "𝄞", "a"}
		x.Strings = []string{}
		for i := range n {
			x.Strings = append(x.Strings, pool[(int(i)+seed)%len(pool)])
		}
	case "bool":
		x.Data = make([]byte, n)
		for i := range x.Data {
			x.Data[i] = byte((i + seed) % 2)
		}
	default:
		x.Data = make([]byte, n*int64(codec.ElemSize(typ)))
		for i := range x.Data {
			x.Data[i] = byte(37*i + 11 + 13*seed)
		}
	}
	return x
}

// parityFixedGraph is three Identities of element type dt, of fixed shapes: y = x [2,3],
// z = e [0,3] (zero-size) and w = s [] (rank 0).
func parityFixedGraph(dt onnxgen.DataType) *onnxgen.Graph {
	g := onnxgen.NewGraph("parity_fixed")
	for _, io := range []struct {
		in, out string
		dims    []any
	}{{"x", "y", []any{2, 3}}, {"e", "z", []any{0, 3}}, {"s", "w", nil}} {
		g.AddInput(io.in, dt, io.dims...)
		g.AddOutput(io.out, dt, io.dims...)
		g.AddNode("Identity", []string{io.in}, []string{io.out})
	}
	return g
}

// parityNoInputsGraph is a model without inputs: a Constant float32 [2,3] of values cast
// to every type ("o_TYPE", [2,3]); a Constant scalar cast to float16, bfloat16 and int64
// ("s_TYPE", rank 0); and a Constant of shape [0,2] cast to float16 ("none").
func parityNoInputsGraph(values []float32) *onnxgen.Graph {
	g := onnxgen.NewGraph("parity_noinputs")
	g.AddNode("Constant", nil, []string{"c"}, onnxgen.AttrTensor("value", onnxgen.FloatTensor("c_value", []int64{2, 3}, values)))
	g.AddNode("Constant", nil, []string{"s"}, onnxgen.AttrTensor("value", onnxgen.FloatTensor("s_value", nil, []float32{2.5})))
	g.AddNode("Constant", nil, []string{"z"}, onnxgen.AttrTensor("value", onnxgen.FloatTensor("z_value", []int64{0, 2}, nil)))
	for _, typ := range parityTypes {
		dt := onnxgen.DataTypes[typ]
		g.AddOutput("o_"+typ, dt, 2, 3)
		g.AddNode("Cast", []string{"c"}, []string{"o_" + typ}, onnxgen.AttrInt("to", int64(dt)))
	}
	for _, typ := range []string{"float16", "bfloat16", "int64"} {
		dt := onnxgen.DataTypes[typ]
		g.AddOutput("s_"+typ, dt)
		g.AddNode("Cast", []string{"s"}, []string{"s_" + typ}, onnxgen.AttrInt("to", int64(dt)))
	}
	g.AddOutput("none", onnxgen.Float16, 0, 2)
	g.AddNode("Cast", []string{"z"}, []string{"none"}, onnxgen.AttrInt("to", int64(onnxgen.Float16)))
	return g
}

// parityMixedGraph has rank-0 float16 and string inputs beside tensors of open shape and
// an int64 scalar (onnxgen.MixedScalarsGraph).
func parityMixedGraph() *onnxgen.Graph { return onnxgen.MixedScalarsGraph("parity_mixed") }

func describeTensor(x *codec.Tensor) string {
	if x == nil {
		return "nil"
	}
	if x.Type == "string" {
		return fmt.Sprintf("%s %v %q", x.Type, x.Shape, x.Strings)
	}
	return fmt.Sprintf("%s %v % x", x.Type, x.Shape, x.Data)
}
