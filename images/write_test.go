package images

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// dirNames lists the names in dir, failing the test on error.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// checkPNG reads path back and checks it is a 0644 PNG of img's size.
func checkPNG(t *testing.T, path string, img image.Image) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	back, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", path, err)
	}
	if back.Bounds() != img.Bounds() {
		t.Errorf("%s bounds %v, want %v", path, back.Bounds(), img.Bounds())
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("%s mode %v, want a regular 0644 file", path, fi.Mode())
	}
}

func TestCreatePNG(t *testing.T) {
	f := newFixture(t)
	img := solid(4, 3, color.NRGBA{10, 20, 30, 255})
	secret, err := os.ReadFile(f.p("outside/secret.png"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", f.p("img/subalias")); err != nil {
		t.Fatal(err)
	}
	pol := Policy{AllowedRoots: []string{f.p("img2")}, OutputRoots: []string{f.root, f.p("rootlink")}}

	// New files: written, readable, and no temporary file left behind.
	for _, tt := range []struct{ path, lands string }{
		{f.p("img/out.png"), f.p("img/out.png")},
		{f.p("img/sub/out.png"), f.p("img/sub/out.png")},
		{f.p("rootlink/viaroot.png"), f.p("img/viaroot.png")},
		{f.p("img/subalias/alias.png"), f.p("img/sub/alias.png")}, // a symlink inside the root is fine
	} {
		if err := pol.CreatePNG(tt.path, img); err != nil {
			t.Fatalf("CreatePNG(%q): %v", tt.path, err)
		}
		checkPNG(t, tt.lands, img)
	}
	for _, dir := range []string{f.root, f.p("img/sub")} {
		for _, n := range dirNames(t, dir) {
			if strings.Contains(n, ".tmp-") {
				t.Errorf("temporary file %s left in %s", n, dir)
			}
		}
	}

	refused := []struct {
		name string
		path string
		code codec.Code
	}{
		{"existing file", f.p("img/a.png"), codec.CodeForbiddenPath},
		{"file written before", f.p("img/out.png"), codec.CodeForbiddenPath},
		{"existing symlink in", f.p("img/link_in.png"), codec.CodeForbiddenPath},
		{"existing symlink out", f.p("img/link_out.png"), codec.CodeForbiddenPath},
		{"dangling symlink out", f.p("img/dangling_out.png"), codec.CodeForbiddenPath},
		{"existing directory", f.p("img/sub"), codec.CodeForbiddenPath},
		{"outside", f.p("outside/new.png"), codec.CodeForbiddenPath},
		{"allowed root, not an output root", f.p("img2/new.png"), codec.CodeForbiddenPath},
		{"prefix sibling", f.p("img2/a.png"), codec.CodeForbiddenPath},
		{"the root itself", f.root, codec.CodeForbiddenPath},
		{"directory symlink out", f.p("img/linkdir_out/new.png"), codec.CodeForbiddenPath},
		{"relative", "img/new.png", codec.CodeBadRequest},
		{"not clean", f.root + "/sub/../new.png", codec.CodeBadRequest},
		{"dotdot escape", f.root + "/../outside/new.png", codec.CodeBadRequest},
		{"trailing slash", f.root + "/new.png/", codec.CodeBadRequest},
		{"empty", "", codec.CodeBadRequest},
		{"missing directory", f.p("img/nodir/new.png"), codec.CodeFileNotFound},
	}
	before := map[string][]byte{}
	for _, p := range []string{"img/a.png", "img/out.png"} {
		b, err := os.ReadFile(f.p(p))
		if err != nil {
			t.Fatal(err)
		}
		before[p] = b
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			err := pol.CreatePNG(tt.path, img)
			if c := codeOf(t, err); c != tt.code {
				t.Fatalf("CreatePNG(%q) code %q (%v), want %q", tt.path, c, err, tt.code)
			}
		})
	}
	// Nothing refused was touched or created.
	for p, b := range before {
		if got, _ := os.ReadFile(f.p(p)); !bytes.Equal(got, b) {
			t.Errorf("%s was changed by a refused write", p)
		}
	}
	if got, _ := os.ReadFile(f.p("outside/secret.png")); !bytes.Equal(got, secret) {
		t.Error("outside/secret.png was changed")
	}
	if fi, err := os.Lstat(f.p("img/link_out.png")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("img/link_out.png is no longer a symlink: %v %v", fi, err)
	}
	if names := dirNames(t, f.p("outside")); len(names) != 1 {
		t.Errorf("outside/ holds %v, want only secret.png", names)
	}
	if names := dirNames(t, f.p("img2")); len(names) != 1 {
		t.Errorf("img2/ holds %v, want only a.png", names)
	}
	for _, n := range dirNames(t, f.root) {
		if strings.Contains(n, ".tmp-") || n == "new.png" {
			t.Errorf("refused writes left %s in the root", n)
		}
	}
}

// TestCreatePNGDirectorySwapped: the directory of an out_path passes the check, then is
// replaced by a symlink leading out of the root before the write (as a hostile client
// with write access to the root could do between Prepare and Run). The write must fail
// and put nothing outside.
func TestCreatePNGDirectorySwapped(t *testing.T) {
	f := newFixture(t)
	img := solid(2, 2, color.Black)
	pol := Policy{OutputRoots: []string{f.root}}
	work := f.p("img/work")
	mustMkdir(t, work)
	out := filepath.Join(work, "mask.png")
	if _, err := pol.CheckWritable(out); err != nil {
		t.Fatalf("CheckWritable before the swap: %v", err)
	}
	for _, target := range []string{f.p("outside"), "../outside"} { // absolute and relative links
		if err := os.RemoveAll(work); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, work); err != nil {
			t.Fatal(err)
		}
		err := pol.CreatePNG(out, img)
		if c := codeOf(t, err); c != codec.CodeForbiddenPath {
			t.Fatalf("CreatePNG through a swapped directory (-> %s): %v, want forbidden_path", target, err)
		}
		if names := dirNames(t, f.p("outside")); len(names) != 1 || names[0] != "secret.png" {
			t.Fatalf("the write through the swapped directory (-> %s) left %v outside", target, names)
		}
	}
	// The same swap of the output root's own parent chain cannot matter either: the root
	// is opened once and everything below it is resolved inside it.
}

func TestCreatePNGIn(t *testing.T) {
	dir := t.TempDir()
	img := solid(3, 2, color.White)
	seen := map[string]bool{}
	for range 3 {
		path, err := CreatePNGIn(dir, "ortbus-segment-", img, false)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(path) != dir || !strings.HasPrefix(filepath.Base(path), "ortbus-segment-") || filepath.Ext(path) != ".png" {
			t.Errorf("path %q, want %s/ortbus-segment-*.png", path, dir)
		}
		if seen[path] {
			t.Errorf("name %s given twice", path)
		}
		seen[path] = true
		checkPNG(t, path, img)
	}
	if names := dirNames(t, dir); len(names) != 3 {
		t.Errorf("spool holds %v, want the 3 outputs and nothing else", names)
	}
	// A missing spool directory is the operator's to fix: unavailable, naming the key.
	if _, err := CreatePNGIn(filepath.Join(dir, "missing"), "x-", img, true); codec.CodeOf(err) != codec.CodeUnavailable || !strings.Contains(err.Error(), "spool_dir") {
		t.Errorf("CreatePNGIn into a missing directory: %v, want unavailable naming [security] spool_dir", err)
	}
}
