package models

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/npy"
	"github.com/ortbus/ortbus/ort"
)

const (
	rawEnvLib = "ORTBUS_RAW_LIB"
	rawEnvDir = "ORTBUS_RAW_DIR"
)

// TestRawByPath runs the raw kind's tensors by path (input_paths, output_dir,
// output_paths) on the generated tiny model in ONNX Runtime 1.30.0, in a child process.
func TestRawByPath(t *testing.T) {
	testenv.RunChild(t, "TestRawByPathChild", rawEnvLib+"="+testenv.RuntimeLib(t, "1.30.0"), rawEnvDir+"="+filepath.Join(testenv.Models(t), onnxgen.TinyDir))
}

func TestRawByPathChild(t *testing.T) {
	if !testenv.InChild("TestRawByPathChild") {
		t.Skip("runs only as a child of TestRawByPath")
	}
	rt, err := ort.Load(os.Getenv(rawEnvLib))
	if err != nil {
		t.Fatal(err)
	}
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root, spool, outside := filepath.Join(base, "root"), filepath.Join(base, "root", "spool"), filepath.Join(base, "outside")
	for _, d := range []string{spool, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := Env{Runtime: rt, Images: images.Policy{AllowedRoots: []string{root}, OutputRoots: []string{spool}}, SpoolDir: spool}
	m, err := Open(env, &config.Model{Name: "tiny", Kind: config.KindRaw, Dir: os.Getenv(rawEnvDir)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	x := &codec.Tensor{Type: "float32", Shape: []int64{2, onnxgen.TinyDim}, Data: codec.Float32Bytes([]float32{0, 1, 2, 3, -1, -2, 0.5, 100})}
	write := func(path string, t0 *codec.Tensor) {
		b, err := npy.Encode(t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	xPath := filepath.Join(root, "x.npy")
	write(xPath, x)
	write(filepath.Join(outside, "x.npy"), x)
	write(filepath.Join(root, "x_int.npy"), &codec.Tensor{Type: "int64", Shape: []int64{1, onnxgen.TinyDim}, Data: make([]byte, 8*onnxgen.TinyDim)})
	if err := os.Symlink("../outside/x.npy", filepath.Join(root, "x_out.npy")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spool, "taken.npy"), []byte("someone's file"), 0o644); err != nil {
		t.Fatal(err)
	}

	run := func(req codec.Request) (*codec.InferReply, error) {
		it, err := m.Prepare("infer", &codec.WorkItem{Request: req, Op: "infer"})
		if err != nil {
			return nil, err
		}
		reps, errs := m.Run(context.Background(), "infer", []Item{it})
		if errs[0] != nil {
			return nil, errs[0]
		}
		return reps[0].(*codec.InferReply), nil
	}
	inline, err := run(codec.Request{Inputs: map[string]*codec.Tensor{"x": x}})
	if err != nil {
		t.Fatal(err)
	}
	want := inline.Outputs["y"]
	if want == nil || len(want.Data) != len(x.Data) {
		t.Fatalf("inline reply %+v", inline)
	}
	byPath, err := run(codec.Request{InputPaths: map[string]string{"x": xPath}})
	if err != nil {
		t.Fatal(err)
	}
	if got := byPath.Outputs["y"]; got == nil || !bytes.Equal(got.Data, want.Data) || len(byPath.OutputPaths) != 0 {
		t.Fatalf("by path: %+v, want the inline reply's y", byPath)
	}
	readBack := func(path string) {
		t.Helper()
		got, err := env.Images.OpenTensor(path)
		if err != nil {
			t.Fatal(err)
		}
		if got.Type != "float32" || len(got.Shape) != 2 || got.Shape[0] != 2 || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("%s holds %s %v, want the inline reply's y", path, got.Type, got.Shape)
		}
	}
	toDir, err := run(codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: spool})
	if err != nil {
		t.Fatal(err)
	}
	if p := toDir.OutputPaths["y"]; p != filepath.Join(spool, "y.npy") || len(toDir.Outputs) != 0 {
		t.Fatalf("output_dir reply %+v", toDir)
	}
	readBack(filepath.Join(spool, "y.npy"))
	named := filepath.Join(spool, "named.npy")
	toPath, err := run(codec.Request{Inputs: map[string]*codec.Tensor{"x": x}, OutputPaths: map[string]string{"y": named}, Outputs: []string{"y"}})
	if err != nil {
		t.Fatal(err)
	}
	if toPath.OutputPaths["y"] != named || len(toPath.Outputs) != 0 {
		t.Fatalf("output_paths reply %+v", toPath)
	}
	readBack(named)

	for _, c := range []struct {
		name string
		req  codec.Request
		code codec.Code
		says string
	}{
		{"both inline and by path", codec.Request{Inputs: map[string]*codec.Tensor{"x": x}, InputPaths: map[string]string{"x": xPath}}, codec.CodeBadRequest, "both inline"},
		{"unknown input", codec.Request{InputPaths: map[string]string{"x": xPath, "z": xPath}}, codec.CodeBadRequest, `no input "z"`},
		{"wrong dtype", codec.Request{InputPaths: map[string]string{"x": filepath.Join(root, "x_int.npy")}}, codec.CodeBadRequest, "is int64, the model wants float32"},
		{"symlink out of the roots", codec.Request{InputPaths: map[string]string{"x": filepath.Join(root, "x_out.npy")}}, codec.CodeForbiddenPath, "outside the allowed roots"},
		{"input outside", codec.Request{InputPaths: map[string]string{"x": filepath.Join(outside, "x.npy")}}, codec.CodeForbiddenPath, "outside the allowed roots"},
		{"input missing", codec.Request{InputPaths: map[string]string{"x": filepath.Join(root, "none.npy")}}, codec.CodeFileNotFound, "not found"},
		{"output written before", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: spool}, codec.CodeForbiddenPath, "already exists"},
		{"output over a file", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputPaths: map[string]string{"y": filepath.Join(spool, "taken.npy")}}, codec.CodeForbiddenPath, "already exists"},
		{"output_dir not an output root", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: root}, codec.CodeForbiddenPath, "outside the output roots"},
		{"output_dir outside", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: outside}, codec.CodeForbiddenPath, "outside the output roots"},
		{"output_dir unclean", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: spool + "/"}, codec.CodeBadRequest, "not an absolute, clean path"},
		{"output_dir relative", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: "spool"}, codec.CodeBadRequest, "not an absolute, clean path"},
		{"output_dir missing", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: filepath.Join(spool, "nodir")}, codec.CodeFileNotFound, "does not exist"},
		{"unknown output path", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputPaths: map[string]string{"z": filepath.Join(spool, "z.npy")}}, codec.CodeBadRequest, `no output "z"`},
		{"output_dir and output_paths", codec.Request{InputPaths: map[string]string{"x": xPath}, OutputDir: spool, OutputPaths: map[string]string{"y": named}}, codec.CodeBadRequest, "exclude each other"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep, err := run(c.req)
			if codec.CodeOf(err) != c.code {
				t.Fatalf("got %+v, %v; want %s", rep, err, c.code)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Errorf("error %q does not say %q", err, c.says)
			}
		})
	}
	// The refused outputs left nothing behind.
	names, _ := os.ReadDir(spool)
	var got []string
	for _, e := range names {
		got = append(got, e.Name())
	}
	if strings.Join(got, " ") != "named.npy taken.npy y.npy" {
		t.Errorf("spool holds %v", got)
	}
}
