// Package modelrev finds a model's files without loading it (no ONNX Runtime, no cgo):
// its folder (a configured dir, or its snapshot in the Hugging Face cache) and the file
// of each role its kind reads (config.Kinds). The gateway's result cache hashes them into
// the model's revision; package models loads them.
package modelrev

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// Dir returns the folder holding a model's files: its configured dir, or its snapshot in
// the Hugging Face cache ($HF_HOME/hub/models--ORG--NAME/snapshots/REV), found offline:
// REV is hf_revision when that snapshot exists, else the commit that refs/<hf_revision or
// main> names. Nothing is ever downloaded.
func Dir(m *config.Model) (string, error) {
	if m.Dir != "" {
		return m.Dir, nil
	}
	home := os.Getenv("HF_HOME")
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("model %s: HF_HOME is not set and there is no home directory", m.Name)
		}
		home = filepath.Join(h, ".cache", "huggingface")
	}
	repo := filepath.Join(home, "hub", "models--"+strings.ReplaceAll(m.HFRepo, "/", "--"))
	rev := m.HFRevision
	if rev == "" {
		rev = "main"
	}
	snap := filepath.Join(repo, "snapshots", rev)
	if st, err := os.Stat(snap); err == nil && st.IsDir() {
		return snap, nil
	}
	ref, err := os.ReadFile(filepath.Join(repo, "refs", rev))
	if err != nil {
		return "", codec.Errorf(codec.CodeUnknownModel, "model %s: %s is not in the Hugging Face cache (looked for %s and %s); download it first, ortbus never does",
			m.Name, m.HFRepo, snap, filepath.Join(repo, "refs", rev))
	}
	return filepath.Join(repo, "snapshots", strings.TrimSpace(string(ref))), nil
}

// File is one file of a model: its role (config.Kind.Files) and path.
type File struct {
	Role, Path string
}

// Files lists the files a model's kind may read, by role (sorted), each the model's
// `files` entry for the role or the kind's default name, inside Dir unless absolute;
// roles whose file does not exist are left out.
func Files(m *config.Model) ([]File, error) {
	dir, err := Dir(m)
	if err != nil {
		return nil, err
	}
	k, _ := config.KindOf(m.Kind)
	roles := map[string]string{}
	for r, n := range k.Files {
		roles[r] = n
	}
	for r, n := range m.Files {
		roles[r] = n
	}
	var out []File
	for r, n := range roles {
		if n == "" {
			continue
		}
		p := n
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, n)
		}
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			out = append(out, File{Role: r, Path: p})
		}
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(a.Role, b.Role) })
	return out, nil
}
