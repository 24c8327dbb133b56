package jobs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// tree makes an allowed root holding lib/ (a.png, notes.txt, sub/b.png) and, outside
// every root, a directory of images (secret.png, deep/s.png) that must never be listed.
func tree(t *testing.T) (p images.Policy, root, lib, outside string) {
	t.Helper()
	root, outside = t.TempDir(), t.TempDir()
	lib = filepath.Join(root, "lib")
	for _, f := range []string{filepath.Join(lib, "a.png"), filepath.Join(lib, "notes.txt"), filepath.Join(lib, "sub", "b.png"),
		filepath.Join(outside, "secret.png"), filepath.Join(outside, "deep", "s.png")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		var content []byte // notes.txt: no image
		if strings.HasSuffix(f, ".png") {
			content = []byte(pngMagic)
		}
		if err := os.WriteFile(f, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return images.Policy{AllowedRoots: []string{root}}, root, lib, outside
}

// pngMagic is the start of a PNG file: what the walk reads to take a file as an image.
const pngMagic = "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"

// swap replaces dir with a symlink to target, as a client with write access inside the
// root could between a check and its use.
func swap(t *testing.T, dir, target string) {
	t.Helper()
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, dir); err != nil {
		t.Fatal(err)
	}
}

func hook[T any](t *testing.T, h *T, f T) {
	*h = f
	t.Cleanup(func() { var zero T; *h = zero })
}

// noneOutside fails if any listed path lies outside root.
func noneOutside(t *testing.T, got Listing, root string) {
	t.Helper()
	for _, p := range got.Items {
		if !strings.HasPrefix(p, root+string(filepath.Separator)) {
			t.Errorf("listed %s, outside the allowed root %s", p, root)
		}
	}
}

// Symlinks inside the directory are not followed, wherever they lead; a directory that is
// a symlink out of the roots is refused; one that leads to another directory inside them
// is listed under that directory.
func TestExpandAllowedFollowsNoWayOut(t *testing.T) {
	p, root, lib, outside := tree(t)
	os.Symlink(outside, filepath.Join(lib, "out"))
	os.Symlink(filepath.Join(outside, "secret.png"), filepath.Join(lib, "x.png"))
	got, e := ExpandAllowed(p, codec.JobDir{Path: lib, Recursive: true}, 100)
	if want := fmt.Sprint([]string{filepath.Join(lib, "a.png"), filepath.Join(lib, "sub", "b.png")}); e != nil || fmt.Sprint(got.Items) != want {
		t.Fatalf("got %v %v, want %s", got, e, want)
	}
	os.Symlink(outside, filepath.Join(root, "away"))
	if got, e := ExpandAllowed(p, codec.JobDir{Path: filepath.Join(root, "away"), Recursive: true}, 100); e == nil || e.Code != codec.CodeForbiddenPath {
		t.Fatalf("a directory linking out of the roots: %v %v, want forbidden_path", got, e)
	}
	os.Symlink(lib, filepath.Join(root, "alias"))
	got, e = ExpandAllowed(p, codec.JobDir{Path: filepath.Join(root, "alias")}, 100)
	if want := fmt.Sprint([]string{filepath.Join(lib, "a.png")}); e != nil || fmt.Sprint(got.Items) != want {
		t.Fatalf("a directory linking inside the roots: %v %v, want %s", got, e, want)
	}
	if _, e := ExpandAllowed(p, codec.JobDir{Path: filepath.Join(lib, "a.png")}, 100); e == nil || e.Code != codec.CodeBadRequest {
		t.Fatalf("a file as the directory: %v, want bad_request", e)
	}
	if _, e := ExpandAllowed(p, codec.JobDir{Path: filepath.Join(lib, "none")}, 100); e == nil || e.Code != codec.CodeFileNotFound {
		t.Fatalf("a missing directory: %v, want file_not_found", e)
	}
	if _, e := ExpandAllowed(p, codec.JobDir{Path: outside}, 100); e == nil || e.Code != codec.CodeForbiddenPath {
		t.Fatalf("a directory outside the roots: %v, want forbidden_path", e)
	}
}

// The directory checked, then swapped for a symlink out of the root before it is opened:
// nothing outside is listed.
func TestExpandAllowedDirectorySwappedAfterCheck(t *testing.T) {
	p, root, lib, outside := tree(t)
	hook(t, &testHookChecked, func() { swap(t, lib, outside) })
	got, e := ExpandAllowed(p, codec.JobDir{Path: lib, Recursive: true}, 100)
	noneOutside(t, got, root)
	if e == nil || e.Code != codec.CodeForbiddenPath {
		t.Fatalf("got %v %v, want forbidden_path", got, e)
	}
}

// A subdirectory listed as a directory, then swapped before it is read: for a symlink out
// of the root (nothing outside is listed), or for a FIFO (the walk does not block).
func TestExpandAllowedSubdirectorySwappedDuringTheWalk(t *testing.T) {
	for _, c := range []struct {
		name string
		code codec.Code
		put  func(t *testing.T, dir, outside string)
	}{
		{"symlink", codec.CodeForbiddenPath, func(t *testing.T, dir, outside string) { swap(t, dir, outside) }},
		{"fifo", codec.CodeBadRequest, func(t *testing.T, dir, _ string) {
			if err := os.Rename(dir, dir+".old"); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(dir, 0o644); err != nil {
				testenv.Unavailable(t, "no FIFOs here: "+err.Error())
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, root, lib, outside := tree(t)
			hook(t, &testHookEnter, func(dir string) {
				if dir == "sub" {
					c.put(t, filepath.Join(lib, "sub"), outside)
				}
			})
			got, e := ExpandAllowed(p, codec.JobDir{Path: lib, Recursive: true}, 100)
			noneOutside(t, got, root)
			if e == nil || e.Code != c.code || e.Details["path"] != filepath.Join(lib, "sub") && c.code == codec.CodeForbiddenPath {
				t.Fatalf("got %v %v, want %s naming %s", got, e, c.code, filepath.Join(lib, "sub"))
			}
		})
	}
}
