package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ortbus/ortbus/models/gguf"
)

// TestGenLLM: `ortbus models gen-llm DIR -size tiny` writes a GGUF file whose header
// reads as the tiny llama; an unknown size and a missing DIR are refused.
func TestGenLLM(t *testing.T) {
	dir := t.TempDir()
	if code := run([]string{"models", "gen-llm", dir, "-size", "tiny"}); code != 0 {
		t.Fatalf("gen-llm exited %d", code)
	}
	h, err := gguf.ReadHeaderFile(filepath.Join(dir, gguf.FileName("tiny")))
	if err != nil {
		t.Fatal(err)
	}
	if h.Get("general.architecture") != "llama" || h.Get("general.name") != gguf.Tiny.Name {
		t.Fatalf("architecture %v, name %v", h.Get("general.architecture"), h.Get("general.name"))
	}
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	stderr := os.Stderr
	os.Stderr = devnull
	defer func() { os.Stderr = stderr }()
	if code := run([]string{"models", "gen-llm", dir, "-size", "huge"}); code != 1 {
		t.Errorf("unknown size: exit %d, want 1", code)
	}
	if code := run([]string{"models", "gen-llm", "-size", "tiny"}); code != 2 {
		t.Errorf("no DIR: exit %d, want 2", code)
	}
}
