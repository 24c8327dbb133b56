package models

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// TestKindsTable: the worker loads exactly the kinds of config.Kinds, a model's ops and
// batching are its kind's, and a missing required file is refused before any session is
// created (no runtime needed).
func TestKindsTable(t *testing.T) {
	for _, k := range config.Kinds {
		if openers[k.Name] == nil {
			t.Errorf("kind %s has no opener", k.Name)
		}
		b := newBase(Env{}, &config.Model{Name: "m", Kind: k.Name})
		if !reflect.DeepEqual(b.Ops(), k.Ops) {
			t.Errorf("kind %s: ops %v, want %v", k.Name, b.Ops(), k.Ops)
		}
		for _, op := range k.Ops {
			if b.Batchable(op) != k.Batchable(op) {
				t.Errorf("kind %s: Batchable(%s) = %v", k.Name, op, b.Batchable(op))
			}
		}
		// An empty folder: the first required file is missing.
		dir := t.TempDir()
		_, err := Open(Env{}, &config.Model{Name: "m", Kind: k.Name, Dir: dir})
		want := filepath.Join(dir, k.Files[k.Required[0]])
		if codec.CodeOf(err) != codec.CodeFileNotFound || !strings.Contains(err.Error(), want) {
			t.Errorf("kind %s in an empty folder: %v, want file_not_found naming %s", k.Name, err, want)
		}
	}
	if len(openers) != len(config.Kinds) {
		t.Errorf("%d openers for %d kinds", len(openers), len(config.Kinds))
	}
	if _, err := Open(Env{}, &config.Model{Name: "m", Kind: "magic", Dir: t.TempDir()}); codec.CodeOf(err) != codec.CodeUnknownModel {
		t.Errorf("unknown kind: %v", err)
	}
	// A second required file (a tagger's tags) is checked too, before the model loads.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.onnx"), []byte("not onnx"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Open(Env{}, &config.Model{Name: "m", Kind: config.KindTaggerWD14, Dir: dir})
	if codec.CodeOf(err) != codec.CodeFileNotFound || !strings.Contains(err.Error(), "selected_tags.csv") {
		t.Errorf("tagger without tags: %v", err)
	}
}
