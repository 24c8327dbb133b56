package config

import (
	"path/filepath"
	"testing"
)

// TestDeployConfigs: every example config in deploy/ parses and validates.
func TestDeployConfigs(t *testing.T) {
	files, err := filepath.Glob("../deploy/*.toml")
	if err != nil || len(files) == 0 {
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
