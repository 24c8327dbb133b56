package images

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

func TestWithin(t *testing.T) {
	tests := []struct {
		root, path string
		want       bool
	}{
		{"/srv/img", "/srv/img", true},
		{"/srv/img", "/srv/img/a.png", true},
		{"/srv/img", "/srv/img/x/y/z.png", true},
		{"/srv/img", "/srv/img2", false},
		{"/srv/img", "/srv/img2/a.png", false},
		{"/srv/img", "/srv/im", false},
		{"/srv/img", "/srv", false},
		{"/srv/img", "/srv/imga.png", false},
		{"/", "/etc/passwd", true},
		{"/", "/", true},
	}
	for _, tt := range tests {
		if got := within(tt.root, tt.path); got != tt.want {
			t.Errorf("within(%q, %q) = %v, want %v", tt.root, tt.path, got, tt.want)
		}
	}
}

// TestCheck covers every path refusal; Open shares these checks (see TestOpenErrors).
func TestCheck(t *testing.T) {
	f := newFixture(t)
	pol := f.policy()
	tests := []struct {
		name string
		path string
		code codec.Code // "" = accepted
		want string     // resolved path when accepted
	}{
		{"empty", "", codec.CodeBadRequest, ""},
		{"relative", "img/a.png", codec.CodeBadRequest, ""},
		{"dot relative", "./a.png", codec.CodeBadRequest, ""},
		{"dotdot escape", f.root + "/../outside/secret.png", codec.CodeBadRequest, ""},
		{"root/../etc/passwd", "/root/../etc/passwd", codec.CodeBadRequest, ""},
		{"dotdot back inside", f.root + "/sub/../a.png", codec.CodeBadRequest, ""},
		{"dot component", f.root + "/./a.png", codec.CodeBadRequest, ""},
		{"double slash", f.root + "//a.png", codec.CodeBadRequest, ""},
		{"trailing slash", f.root + "/sub/", codec.CodeBadRequest, ""},
		{"NUL byte", f.root + "/a.png\x00.txt", codec.CodeBadRequest, ""},
		{"etc passwd", "/etc/passwd", codec.CodeForbiddenPath, ""},
		{"outside existing", f.p("outside/secret.png"), codec.CodeForbiddenPath, ""},
		{"outside missing is not file_not_found", f.p("outside/nope.png"), codec.CodeForbiddenPath, ""},
		{"prefix sibling root", f.p("img2/a.png"), codec.CodeForbiddenPath, ""},
		{"prefix sibling missing", f.p("img2/nope.png"), codec.CodeForbiddenPath, ""},
		{"parent of root", f.base, codec.CodeForbiddenPath, ""},
		{"symlink out", f.p("img/link_out.png"), codec.CodeForbiddenPath, ""},
		{"dangling symlink out", f.p("img/dangling_out.png"), codec.CodeForbiddenPath, ""},
		{"through dir symlink out", f.p("img/linkdir_out/secret.png"), codec.CodeForbiddenPath, ""},
		{"through dir symlink out, missing", f.p("img/linkdir_out/nope.png"), codec.CodeForbiddenPath, ""},
		{"symlink loop", f.p("img/loop.png"), codec.CodeBadRequest, ""},
		{"missing", f.p("img/nope.png"), codec.CodeFileNotFound, ""},
		{"missing dir", f.p("img/nodir/x.png"), codec.CodeFileNotFound, ""},
		{"file used as dir", f.p("img/a.png/x"), codec.CodeFileNotFound, ""},
		{"dangling symlink in", f.p("img/dangling_in.png"), codec.CodeFileNotFound, ""},
		{"regular", f.p("img/a.png"), "", f.p("img/a.png")},
		{"symlink in", f.p("img/link_in.png"), "", f.p("img/a.png")},
		{"root itself", f.root, "", f.root},
		{"directory (type is Open's job)", f.p("img/sub"), "", f.p("img/sub")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := pol.Check(tt.path)
			if c := codeOf(t, err); c != tt.code {
				t.Fatalf("Check(%q) code %q (%v), want %q", tt.path, c, err, tt.code)
			}
			if tt.code == "" && got != tt.want {
				t.Fatalf("Check(%q) = %q, want %q", tt.path, got, tt.want)
			}
			if tt.code == codec.CodeForbiddenPath && strings.Contains(err.Error(), "outside/") &&
				!strings.Contains(tt.path, "outside/") {
				t.Fatalf("forbidden message leaks the link target: %v", err)
			}
		})
	}
}

func TestCheckRootSpellings(t *testing.T) {
	f := newFixture(t)
	// A root configured through a symlink accepts both spellings and resolves them.
	pol := Policy{AllowedRoots: []string{f.p("rootlink")}}
	for _, path := range []string{f.p("rootlink/a.png"), f.p("img/a.png")} {
		got, err := pol.Check(path)
		if err != nil || got != f.p("img/a.png") {
			t.Errorf("Check(%q) = %q, %v; want %q", path, got, err, f.p("img/a.png"))
		}
	}
	if _, err := pol.Check(f.p("img2/a.png")); codeOf(t, err) != codec.CodeForbiddenPath {
		t.Errorf("prefix sibling through a linked root: %v", err)
	}
	// A root with a trailing slash or a relative root.
	pol = Policy{AllowedRoots: []string{f.root + "/", "img2"}}
	if _, err := pol.Check(f.p("img/a.png")); err != nil {
		t.Errorf("root with trailing slash: %v", err)
	}
	if _, err := pol.Check(f.p("img2/a.png")); codeOf(t, err) != codec.CodeForbiddenPath {
		t.Errorf("a relative root must match nothing: %v", err)
	}
	// No roots: nothing is allowed.
	if _, err := (Policy{}).Check(f.p("img/a.png")); codeOf(t, err) != codec.CodeForbiddenPath {
		t.Errorf("zero policy: %v", err)
	}
}

func TestValidate(t *testing.T) {
	f := newFixture(t)
	if err := f.policy().Validate(); err != nil {
		t.Errorf("valid policy: %v", err)
	}
	for _, roots := range [][]string{nil, {"relative"}, {f.p("img/nope")}, {f.p("img/a.png")}} {
		if err := (Policy{AllowedRoots: roots}).Validate(); err == nil {
			t.Errorf("Validate(%q) = nil, want an error", roots)
		}
	}
}

func TestCheckWritable(t *testing.T) {
	f := newFixture(t)
	pol := Policy{OutputRoots: []string{f.root, f.p("rootlink")}}
	tests := []struct {
		name string
		path string
		code codec.Code
		want string
	}{
		{"new file", f.p("img/out.png"), "", f.p("img/out.png")},
		{"new file in subdir", f.p("img/sub/out.png"), "", f.p("img/sub/out.png")},
		{"existing file (never replaced)", f.p("img/a.png"), codec.CodeForbiddenPath, ""},
		{"through linked root", f.p("rootlink/out.png"), "", f.p("img/out.png")},
		{"existing symlink in (never replaced)", f.p("img/link_in.png"), codec.CodeForbiddenPath, ""},
		{"relative", "out.png", codec.CodeBadRequest, ""},
		{"not clean", f.root + "/sub/../out.png", codec.CodeBadRequest, ""},
		{"existing directory", f.p("img/sub"), codec.CodeBadRequest, ""},
		{"missing directory", f.p("img/nodir/out.png"), codec.CodeFileNotFound, ""},
		{"outside", f.p("outside/out.png"), codec.CodeForbiddenPath, ""},
		{"prefix sibling", f.p("img2/out.png"), codec.CodeForbiddenPath, ""},
		{"the root itself", f.root, codec.CodeForbiddenPath, ""},
		{"dir symlink out", f.p("img/linkdir_out/out.png"), codec.CodeForbiddenPath, ""},
		{"file symlink out", f.p("img/link_out.png"), codec.CodeForbiddenPath, ""},
		{"dangling symlink out", f.p("img/dangling_out.png"), codec.CodeForbiddenPath, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := pol.CheckWritable(tt.path)
			if c := codeOf(t, err); c != tt.code {
				t.Fatalf("CheckWritable(%q) code %q (%v), want %q", tt.path, c, err, tt.code)
			}
			if tt.code == "" && got != tt.want {
				t.Fatalf("CheckWritable(%q) = %q, want %q", tt.path, got, tt.want)
			}
		})
	}
	// An allowed (readable) root gives no right to write.
	if _, err := (Policy{AllowedRoots: []string{f.root}}).CheckWritable(f.p("img/out.png")); codeOf(t, err) != codec.CodeForbiddenPath {
		t.Errorf("CheckWritable under an allowed root that is no output root: %v, want forbidden_path", err)
	}
	// Nothing was created by checking.
	if _, err := os.Lstat(filepath.Join(f.root, "out.png")); !os.IsNotExist(err) {
		t.Errorf("CheckWritable created a file: %v", err)
	}
}
