package gateway

import (
	"testing"

	"github.com/ortbus/ortbus/config"
)

// TestServedModelLabel: the model label of a request is the model it named (or its
// class's default, or the one the worker's reply names); one that named none is counted
// under the model its pool serves the op with (the pool's first, in order, whose kind
// serves it), not under an empty label; before any pool, only a named model.
func TestServedModelLabel(t *testing.T) {
	c := &config.Config{
		Pools: map[string]*config.Pool{"bt": {Name: "bt", Models: []string{"seg", "det", "tagger", "oppai"}}},
		Models: map[string]*config.Model{
			"seg":    {Name: "seg", Kind: config.KindSegment},
			"det":    {Name: "det", Kind: config.KindDetect},
			"tagger": {Name: "tagger", Kind: config.KindTaggerPixAI},
			"oppai":  {Name: "oppai", Kind: config.KindTaggerOppai},
		},
	}
	m := &metrics{conf: func() *config.Config { return c }}
	for _, tc := range []struct{ op, pool, model, want string }{
		{"detect", "bt", "", "det"},
		{"segment", "bt", "", "seg"},
		{"tag", "bt", "", "tagger"},
		{"tag", "bt", "oppai", "oppai"},
		{"embed", "bt", "", ""},
		{"detect", "", "", ""},
		{"detect", "", "det", "det"},
		{"detect", "gone", "", ""},
	} {
		if got := m.servedModel(&pending{op: tc.op}, tc.pool, tc.model); got != tc.want {
			t.Errorf("op %s on pool %q, model %q: label %q, want %q", tc.op, tc.pool, tc.model, got, tc.want)
		}
	}
}
