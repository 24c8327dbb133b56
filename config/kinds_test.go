package config

import (
	"slices"
	"testing"

	"github.com/ortbus/ortbus/subjects"
)

// TestKinds: the kind table is whole: unique names, known ops, batched ops among its ops,
// a default file for every required role, and KnownKinds and KindOf agree with it.
func TestKinds(t *testing.T) {
	if len(KnownKinds) != len(Kinds) {
		t.Fatalf("KnownKinds %v, Kinds %d", KnownKinds, len(Kinds))
	}
	for i, k := range Kinds {
		if KnownKinds[i] != k.Name {
			t.Errorf("KnownKinds[%d] = %s, want %s", i, KnownKinds[i], k.Name)
		}
		if got, ok := KindOf(k.Name); !ok || got.Name != k.Name {
			t.Errorf("KindOf(%s) = %v, %v", k.Name, got.Name, ok)
		}
		if slices.Index(KnownKinds, k.Name) != i {
			t.Errorf("kind %s is listed twice", k.Name)
		}
		if len(k.Ops) == 0 {
			t.Errorf("kind %s serves no op", k.Name)
		}
		for _, op := range k.Ops {
			if !slices.Contains(subjects.Ops, op) {
				t.Errorf("kind %s serves unknown op %q", k.Name, op)
			}
		}
		for _, op := range k.Batch {
			if !k.Serves(op) || !k.Batchable(op) {
				t.Errorf("kind %s batches op %q it does not serve", k.Name, op)
			}
		}
		for _, role := range k.Required {
			if k.Files[role] == "" {
				t.Errorf("kind %s requires file role %q without a default name", k.Name, role)
			}
		}
	}
	if _, ok := KindOf("magic"); ok {
		t.Error("KindOf found an unknown kind")
	}
	if ccip, _ := KindOf(KindCCIP); !ccip.Serves(subjects.OpCompare) || ccip.Batchable(subjects.OpCompare) || !ccip.Batchable(subjects.OpEmbed) {
		t.Errorf("ccip: %+v", ccip)
	}
}
