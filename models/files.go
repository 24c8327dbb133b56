package models

import (
	"fmt"
	"os"
	"path/filepath"
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

// file returns the path of one of a model's files by role, and whether it exists: the
// model's `files` entry for the role, else the kind's default name (config.Kinds).
func file(m *config.Model, dir, role string) (string, bool) {
	name := m.Files[role]
	if name == "" {
		k, _ := config.KindOf(m.Kind)
		name = k.Files[role]
	}
	if name == "" {
		return "", false
	}
	p := name
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, name)
	}
	_, err := os.Stat(p)
	return p, err == nil
}

// mustFile is file for a required role: a missing file is an error naming the path.
func mustFile(m *config.Model, dir, role string) (string, error) {
	p, ok := file(m, dir, role)
	if !ok {
		return "", codec.Errorf(codec.CodeUnknownModel, "model %s (%s): %s file %s not found", m.Name, m.Kind, role, p).With("model", m.Name)
	}
	return p, nil
}
