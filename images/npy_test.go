package images

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/npy"
)

// TestTensorFiles: a tensor written with CreateTensor under an output root reads back
// with OpenTensor unchanged, as a new 0644 file, with no temporary file left; and an
// output is never written over anything.
func TestTensorFiles(t *testing.T) {
	f := newFixture(t)
	pol := Policy{AllowedRoots: []string{f.root}, OutputRoots: []string{f.p("img/sub")}}
	in := &codec.Tensor{Type: "float32", Shape: []int64{1, 2, 3}, Data: make([]byte, 24)}
	for i := range in.Data {
		in.Data[i] = byte(i)
	}
	path := f.p("img/sub/x.npy")
	if _, err := pol.CheckWritable(path); err != nil {
		t.Fatal(err)
	}
	if err := pol.CreateTensor(path, in); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("%s: %v %v, want a regular 0644 file", path, fi, err)
	}
	for _, n := range dirNames(t, f.p("img/sub")) {
		if strings.Contains(n, ".tmp-") {
			t.Errorf("temporary file %s left", n)
		}
	}
	out, err := pol.OpenTensor(path)
	if err != nil {
		t.Fatal(err)
	}
	if out.Type != in.Type || len(out.Shape) != 3 || out.Shape[2] != 3 || !bytes.Equal(out.Data, in.Data) {
		t.Errorf("read back %s %v", out.Type, out.Shape)
	}
	// Through a symlink inside the root, too.
	if err := os.Symlink("sub/x.npy", f.p("img/x_link.npy")); err != nil {
		t.Fatal(err)
	}
	if _, err := pol.OpenTensor(f.p("img/x_link.npy")); err != nil {
		t.Errorf("symlink inside the root: %v", err)
	}
	before, _ := os.ReadFile(path)
	for _, c := range []struct {
		name, path string
		code       codec.Code
	}{
		{"existing file", path, codec.CodeForbiddenPath},
		{"allowed root, not an output root", f.p("img/y.npy"), codec.CodeForbiddenPath},
		{"outside", f.p("outside/y.npy"), codec.CodeForbiddenPath},
		{"not clean", f.p("img/sub") + "/../sub/y.npy", codec.CodeBadRequest},
		{"missing directory", f.p("img/sub/nodir/y.npy"), codec.CodeFileNotFound},
	} {
		if err := pol.CreateTensor(c.path, in); codeOf(t, err) != c.code {
			t.Errorf("%s: CreateTensor(%s) = %v, want %s", c.name, c.path, err, c.code)
		}
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Error("a refused write changed the existing file")
	}
	if err := pol.CreateTensor(f.p("img/sub/bad.npy"), &codec.Tensor{Type: "float32", Shape: []int64{2}}); codeOf(t, err) != codec.CodeInternal {
		t.Errorf("invalid tensor: %v, want internal", err)
	}
}

// TestOpenTensorRefusals: the path rules of images, the size bound, and a file that is not
// a usable .npy, each with its code and the client's path in the details.
func TestOpenTensorRefusals(t *testing.T) {
	f := newFixture(t)
	good, err := npy.Encode(&codec.Tensor{Type: "float32", Shape: []int64{4}, Data: make([]byte, 16)})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.p("outside/secret.npy"), good)
	writeFile(t, f.p("img/good.npy"), good)
	writeFile(t, f.p("img/short.npy"), good[:len(good)-1])
	fortran := bytes.Replace(good, []byte("False, 'shape': (4,)"), []byte("True, 'shape': (2,2)"), 1)
	writeFile(t, f.p("img/fortran.npy"), fortran)
	if err := os.Symlink("../outside/secret.npy", f.p("img/link_out.npy")); err != nil {
		t.Fatal(err)
	}
	pol := f.policy()
	if _, err := pol.OpenTensor(f.p("img/good.npy")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		pol        Policy
		code       codec.Code
		says       string
	}{
		{"symlink out of the roots", f.p("img/link_out.npy"), pol, codec.CodeForbiddenPath, "outside the allowed roots"},
		{"outside", f.p("outside/secret.npy"), pol, codec.CodeForbiddenPath, "outside the allowed roots"},
		{"directory symlink out", f.p("img/linkdir_out/secret.npy"), pol, codec.CodeForbiddenPath, "outside the allowed roots"},
		{"missing", f.p("img/missing.npy"), pol, codec.CodeFileNotFound, "not found"},
		{"relative", "img/good.npy", pol, codec.CodeBadRequest, "not absolute"},
		{"directory", f.p("img/sub"), pol, codec.CodeBadRequest, "not a .npy tensor file"},
		{"fifo", f.p("img/fifo"), pol, codec.CodeBadRequest, "not a regular file"},
		{"a PNG", f.p("img/a.png"), pol, codec.CodeBadRequest, "magic"},
		{"size mismatch", f.p("img/short.npy"), pol, codec.CodeBadRequest, "the file holds 15 bytes"},
		{"fortran order", f.p("img/fortran.npy"), pol, codec.CodeBadRequest, "fortran_order"},
		{"over max bytes", f.p("img/good.npy"), Policy{AllowedRoots: []string{f.root}, MaxBytes: int64(len(good) - 1)}, codec.CodeImageTooLarge, "over the limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tn, err := c.pol.OpenTensor(c.path)
			if code := codeOf(t, err); code != c.code {
				t.Fatalf("OpenTensor(%s) = %v, %v; want %s", c.path, tn, err, c.code)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Errorf("error %q does not say %q", err, c.says)
			}
			if codec.AsError(err).Details["path"] != c.path {
				t.Errorf("details %v do not name the path", codec.AsError(err).Details)
			}
		})
	}
}
