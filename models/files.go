package models

import (
	"os"
	"path/filepath"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/modelrev"
)

// Dir returns the folder holding a model's files (modelrev.Dir: a configured dir, or its
// snapshot in the Hugging Face cache, found offline).
func Dir(m *config.Model) (string, error) { return modelrev.Dir(m) }

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
		// A missing file is file_not_found naming it (docs/PROTOCOL.md, section 3), not
		// unknown_model: the model is configured, its file is not where the config says.
		return "", codec.Errorf(codec.CodeFileNotFound, "model %s (%s): %s file %s not found", m.Name, m.Kind, role, p).With("model", m.Name).With("path", p)
	}
	return p, nil
}
