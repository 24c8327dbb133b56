package config

import (
	"io/fs"
	"path/filepath"
	"testing"
)

// TestDeployConfigs: every example config in deploy/ parses and validates.
func TestDeployConfigs(t *testing.T) {
	var files []string
	err := filepath.WalkDir("../deploy", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".toml" {
			files = append(files, p)
		}
		return err
	})
	if err != nil || len(files) < 4 {
		t.Fatalf("no deploy configs found: %v", err)
	}
	for _, f := range files {
		c, err := Load(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(c.Pools) == 0 || len(c.Models) == 0 {
			t.Errorf("%s: no pools or models", f)
		}
	}
}
