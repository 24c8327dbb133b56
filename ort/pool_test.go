package ort

import (
	"testing"

	"github.com/ortbus/ortbus/config"
)

// TestPoolSessionConfigSpin: the pool's spin decision reaches both of ONNX Runtime's
// spinning entries, and the EP chain and thread counts are the pool's.
func TestPoolSessionConfigSpin(t *testing.T) {
	p := &config.Pool{EP: "cuda", Fallback: []string{"cpu"}, Threads: 3, EPOptions: map[string]string{"device_id": "1"}}
	for spin, want := range map[bool]string{true: "1", false: "0"} {
		sc := PoolSessionConfig(p, spin)
		if sc.Entries["session.intra_op.allow_spinning"] != want || sc.Entries["session.inter_op.allow_spinning"] != want {
			t.Errorf("spin %v: entries %v", spin, sc.Entries)
		}
		if sc.IntraOpThreads != 3 || len(sc.Providers) != 2 || sc.Providers[0].Name != "cuda" || sc.Providers[0].Options["device_id"] != "1" || sc.Providers[1].Options != nil {
			t.Errorf("spin %v: %+v", spin, sc)
		}
	}
}
