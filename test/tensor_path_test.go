package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/npy"
)

// TestTensorsByPath runs infer with tensors by path through a real gateway and ortworkers
// on the generated tiny raw model (y = 2x+1): an input .npy written in the allowed root,
// inferred by path with the output written as a new .npy in the spool; the same request
// sent inline gives the same y. A tensor over NATS's 1 MiB max_payload, which cannot
// travel inline, goes by path. The same over the HTTP API as JSON; through a pool with a
// path_map (the client's view of the files differs from the worker's); and the refusals
// (a symlink out of the roots, an output over an existing file, a file that is not a
// .npy, a path the pool's map cannot express) come back with their codes.
func TestTensorsByPath(t *testing.T) {
	root := imageRoot(t)
	spool := filepath.Join(root, "spool")
	outside := filepath.Join(filepath.Dir(root), "outside")
	for _, d := range []string{spool, outside, filepath.Join(root, "in")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The client of the mapped pool sees root as view (a prefix that need not exist here).
	view := filepath.Join(filepath.Dir(root), "client-view")
	dur := func(d time.Duration) config.Duration { return config.Duration(d) }
	lib := testenv.RuntimeLib(t, "1.30.0")
	c := &config.Config{
		NATS:     config.NATS{Embedded: true, Listen: "127.0.0.1:0"},
		Gateway:  config.Gateway{ShutdownGrace: dur(3 * time.Second)},
		Health:   config.Health{HeartbeatInterval: dur(gwHeartbeat), MissCount: gwMissCount},
		Security: config.Security{AllowedRoots: []string{root}, SpoolDir: spool},
		Classes: map[string]*config.Class{
			"interactive": {Chain: []string{"plain"}},
			"batch":       {Chain: []string{"mapped"}},
		},
		Pools: map[string]*config.Pool{
			"plain":  {Runtime: lib, Threads: 1, Classes: []string{"interactive"}, Models: []string{"tiny"}},
			"mapped": {Runtime: lib, Threads: 1, Classes: []string{"batch"}, Models: []string{"tiny"}, PathMap: map[string]string{view: root}},
		},
		Models: map[string]*config.Model{"tiny": {Kind: config.KindRaw, Dir: filepath.Join(testenv.Models(t), onnxgen.TinyDir)}},
	}
	c.SetOrder("classes", "interactive", "batch")
	c.SetOrder("pools", "plain", "mapped")
	g := startGateway(t, writeConfigFile(t, filepath.Join(t.TempDir(), "gateway.toml"), c))
	g.waitLive(t, "plain", 1)
	g.waitLive(t, "mapped", 1)

	xs := make([]float32, 3*onnxgen.TinyDim)
	for i := range xs {
		xs[i] = float32(i)*0.25 - 1
	}
	x := &codec.Tensor{Type: "float32", Shape: []int64{3, onnxgen.TinyDim}, Data: codec.Float32Bytes(xs)}
	xPath := filepath.Join(root, "in", "x.npy")
	writeNPY(t, xPath, x)
	wantY := codec.Float32Bytes(onnxgen.RefTiny(xs))

	infer := func(req *codec.Request) (*codec.InferReply, *codec.Error) {
		t.Helper()
		req.Model = "tiny"
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
	must := func(req *codec.Request) *codec.InferReply {
		t.Helper()
		rep, err := infer(req)
		if err != nil {
			t.Fatalf("%+v: %s: %s (details %v)", req, err.Code, err.Message, err.Details)
		}
		return rep
	}

	// Inline, and by path with the output written to a directory of the spool.
	inline := must(&codec.Request{Inputs: map[string]*codec.Tensor{"x": x}})
	if y := inline.Outputs["y"]; y == nil || !bytes.Equal(y.Data, wantY) {
		t.Fatalf("inline reply %+v, want y = 2x+1", inline)
	}
	outDir := filepath.Join(spool, "run1")
	if err := os.Mkdir(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	byPath := must(&codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: outDir})
	yPath := filepath.Join(outDir, "y.npy")
	if byPath.OutputPaths["y"] != yPath || len(byPath.Outputs) != 0 || byPath.Worker == "" {
		t.Fatalf("by-path reply %+v, want output_paths y = %s and no inline output", byPath, yPath)
	}
	y := readNPY(t, yPath)
	if y.Type != "float32" || fmt.Sprint(y.Shape) != fmt.Sprint(inline.Outputs["y"].Shape) || !bytes.Equal(y.Data, inline.Outputs["y"].Data) {
		t.Fatalf("%s holds %s %v, want the inline reply's y %v", yPath, y.Type, y.Shape, inline.Outputs["y"].Shape)
	}

	// A tensor over the bus's max_payload cannot travel inline; by path it runs.
	big := &codec.Tensor{Type: "float32", Shape: []int64{80_000, onnxgen.TinyDim}, Data: make([]byte, 80_000*onnxgen.TinyDim*4)}
	if b, _ := codec.Marshal(&codec.Request{Model: "tiny", Inputs: map[string]*codec.Tensor{"x": big}}); int64(len(b)) <= g.NC.MaxPayload() {
		t.Fatalf("the big request is %d bytes, not over max_payload %d", len(b), g.NC.MaxPayload())
	} else if _, err := g.NC.Request("ortbus.v1.infer", b, gwReplyBound); !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("a %d-byte inline request: %v, want nats: maximum payload exceeded", len(b), err)
	}
	bigPath := filepath.Join(root, "in", "big.npy")
	writeNPY(t, bigPath, big)
	// Its output inline is over max_payload too: answered reply_too_large, naming the
	// by-path alternative.
	if _, e := infer(&codec.Request{InputPaths: map[string]string{"x": bigPath}}); e == nil || e.Code != codec.CodeReplyTooLarge ||
		!strings.Contains(e.Message, "output_dir") || !strings.Contains(e.Message, "output_paths") {
		t.Errorf("a big output inline: %v, want reply_too_large naming output_dir and output_paths", e)
	}
	bigOut := filepath.Join(spool, "big-y.npy")
	must(&codec.Request{InputPaths: map[string]string{"x": bigPath}, OutputPaths: map[string]string{"y": bigOut}})
	if yb := readNPY(t, bigOut); fmt.Sprint(yb.Shape) != "[80000 4]" || len(yb.Data) != len(big.Data) || yb.Data[3] != 0x3f { // 1.0f = 0x3f800000
		t.Fatalf("%s: %s %v", bigOut, yb.Type, yb.Shape)
	}

	// Over HTTP, as JSON.
	c2 := &httpClient{addr: g.Ready.HTTP}
	httpOut := filepath.Join(spool, "http-y.npy")
	r := c2.do(t, t.Context(), "POST", "/v1/infer", fmt.Sprintf(`{"model":"tiny","input_paths":{"x":%s},"output_paths":{"y":%s}}`, strconv.Quote(xPath), strconv.Quote(httpOut)))
	var hr struct {
		Outputs     map[string]json.RawMessage `json:"outputs"`
		OutputPaths map[string]string          `json:"output_paths"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &hr) != nil || hr.OutputPaths["y"] != httpOut || len(hr.Outputs) != 0 {
		t.Fatalf("HTTP: %d %s", r.status, r.body)
	}
	if !bytes.Equal(readNPY(t, httpOut).Data, wantY) {
		t.Fatal("HTTP: wrong y")
	}

	// Through the mapped pool: the client names files in its view, the worker reads and
	// writes them in its own, and the reply names the output in the client's view.
	mapped := must(&codec.Request{Class: "batch", InputPaths: map[string]string{"x": filepath.Join(view, "in", "x.npy")},
		OutputPaths: map[string]string{"y": filepath.Join(view, "spool", "mapped-y.npy")}})
	if mapped.Pool != "mapped" || mapped.OutputPaths["y"] != filepath.Join(view, "spool", "mapped-y.npy") {
		t.Fatalf("mapped reply %+v, want pool mapped and output_paths in the client's view", mapped)
	}
	if !bytes.Equal(readNPY(t, filepath.Join(spool, "mapped-y.npy")).Data, wantY) {
		t.Fatal("mapped: wrong y")
	}

	// Refusals.
	writeNPY(t, filepath.Join(outside, "x.npy"), x)
	if err := os.Symlink("../../outside/x.npy", filepath.Join(root, "in", "x_out.npy")); err != nil {
		t.Fatal(err)
	}
	hostile := append([]byte(npy.Magic), 2, 0, 0xff, 0xff, 0xff, 0x7f)
	if err := os.WriteFile(filepath.Join(root, "in", "hostile.npy"), hostile, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		req  codec.Request
		code codec.Code
	}{
		{"symlink out of the roots", codec.Request{InputPaths: map[string]string{"x": filepath.Join(root, "in", "x_out.npy")}}, codec.CodeForbiddenPath},
		{"output over an existing file", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: outDir}, codec.CodeForbiddenPath},
		{"output outside the output roots", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: filepath.Join(root, "in")}, codec.CodeForbiddenPath},
		{"a huge header length", codec.Request{InputPaths: map[string]string{"x": filepath.Join(root, "in", "hostile.npy")}}, codec.CodeBadRequest},
		{"both inline and by path", codec.Request{Inputs: map[string]*codec.Tensor{"x": x}, InputPaths: map[string]string{"x": xPath}}, codec.CodeBadRequest},
		{"unmappable on the mapped pool", codec.Request{Class: "batch", InputPaths: map[string]string{"x": xPath}}, codec.CodeForbiddenPath},
	} {
		rep, err := infer(&c.req)
		if err == nil || err.Code != c.code {
			t.Errorf("%s: %+v, %v; want %s", c.name, rep, err, c.code)
		} else {
			t.Logf("%s: %s: %s", c.name, err.Code, err.Message)
		}
	}
	if got := readNPY(t, yPath); !bytes.Equal(got.Data, wantY) {
		t.Error("a refused output changed the existing file")
	}
}

func writeNPY(t testing.TB, path string, x *codec.Tensor) {
	t.Helper()
	b, err := npy.Encode(x)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readNPY(t testing.TB, path string) *codec.Tensor {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	x, err := npy.Decode(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return x
}
