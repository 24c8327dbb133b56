package ort

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/ortbus/ortbus/codec"
)

// LibraryNames are the file names looked for in each searched directory.
var LibraryNames = []string{"libonnxruntime.so.1", "libonnxruntime.so"}

// Spec says where a pool's runtime library may be: an explicit path, directories (runtime
// prefixes or lib folders), and the pool's environment (ORT_DYLIB_PATH, LD_LIBRARY_PATH).
type Spec struct {
	Path string
	Dirs []string
	Env  map[string]string
}

// Configured reports whether the spec names any place at all to look.
func (s Spec) Configured() bool { return len(s.Candidates()) > 0 }

// Candidates lists every path that Find tries, in order: the explicit path,
// ORT_DYLIB_PATH, each directory (and its lib/ folder), then LD_LIBRARY_PATH.
func (s Spec) Candidates() []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	addDir := func(d string) {
		if d == "" {
			return
		}
		for _, n := range LibraryNames {
			add(filepath.Join(d, n))
		}
		if filepath.Base(d) != "lib" {
			for _, n := range LibraryNames {
				add(filepath.Join(d, "lib", n))
			}
		}
	}
	add(s.Path)
	add(s.Env["ORT_DYLIB_PATH"])
	for _, d := range s.Dirs {
		addDir(d)
	}
	for _, d := range strings.Split(s.Env["LD_LIBRARY_PATH"], ":") {
		addDir(d)
	}
	return out
}

// Find returns the first candidate that exists and is an ELF shared object. When none is,
// it returns a runtime_missing *codec.Error whose details list every searched path and
// why each was refused, so an operator can fix the config without guessing.
func (s Spec) Find() (string, error) {
	cands := s.Candidates()
	if len(cands) == 0 {
		return "", codec.Errorf(codec.CodeRuntimeMissing, "no ONNX Runtime library configured (set runtime, runtime_dirs or ORT_DYLIB_PATH)").
			With("searched", []string{})
	}
	var why []string
	for _, p := range cands {
		err := checkLibrary(p)
		if err == nil {
			return p, nil
		}
		why = append(why, fmt.Sprintf("%s: %v", p, err))
	}
	return "", codec.Errorf(codec.CodeRuntimeMissing, "ONNX Runtime library not found; searched %s", strings.Join(cands, ", ")).
		With("searched", cands).With("reasons", why)
}

// checkLibrary opens the file and checks it is an ELF object, so a directory, a text
// file or an unreadable file is refused before the dynamic loader sees it.
func checkLibrary(path string) error {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("no such file")
		}
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("not a regular file")
	}
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || !bytes.Equal(magic, []byte("\x7fELF")) {
		return fmt.Errorf("not an ELF shared library")
	}
	return nil
}
