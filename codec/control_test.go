package codec

import (
	"testing"
	"time"
)

// TestControlSignature: a load or unload signed under the worker's key, for it, now,
// verifies; changing any field, the worker, the verb, the key or the time does not.
func TestControlSignature(t *testing.T) {
	key, now := WorkerKey([]byte("gateway key"), "w1"), time.Now()
	load := &WorkerLoad{Model: "m", Table: "kind = \"raw\"", BudgetBytes: 5, Order: []string{"a", "m"}}
	load.Sign(key, "w1", now.UnixMilli())
	if err := load.Verify(key, "w1", now.Add(time.Second)); err != nil {
		t.Fatalf("a signed load: %v", err)
	}
	for what, bad := range map[string]func(l WorkerLoad) error{
		"table":  func(l WorkerLoad) error { l.Table += " "; return l.Verify(key, "w1", now) },
		"budget": func(l WorkerLoad) error { l.BudgetBytes = 0; return l.Verify(key, "w1", now) },
		"order":  func(l WorkerLoad) error { l.Order = []string{"m", "a"}; return l.Verify(key, "w1", now) },
		"sent":   func(l WorkerLoad) error { l.SentMS++; return l.Verify(key, "w1", now) },
		"worker": func(l WorkerLoad) error { return l.Verify(key, "w2", now) },
		"key":    func(l WorkerLoad) error { return l.Verify(WorkerKey([]byte("gateway key"), "w2"), "w1", now) },
		"order split": func(l WorkerLoad) error {
			// The order's names are fields of their own: ["a", "m"] is not ["a,m"].
			l.Order = []string{"a,m"}
			return l.Verify(key, "w1", now)
		},
		"too old": func(l WorkerLoad) error { return l.Verify(key, "w1", now.Add(2*ControlSkew)) },
	} {
		if err := bad(*load); CodeOf(err) != CodeBadRequest {
			t.Errorf("%s changed: %v, want bad_request", what, err)
		}
	}
	if err := load.Verify(nil, "w1", now); CodeOf(err) != CodeUnavailable {
		t.Errorf("no key: %v, want unavailable", err)
	}
	if err := load.Verify(key[:16], "w1", now); CodeOf(err) != CodeUnavailable {
		t.Errorf("a key too short: %v, want unavailable", err)
	}
	if string(WorkerKey([]byte("g"), "w1")) == string(WorkerKey([]byte("g"), "w2")) || len(key) != MinControlKey {
		t.Error("workers of one gateway share a control key")
	}
	un := &WorkerUnload{Model: "m"}
	un.Sign(key, "w1", now.UnixMilli())
	if err := un.Verify(key, "w1", now); err != nil {
		t.Fatalf("a signed unload: %v", err)
	}
	// A load's signature is not an unload's.
	asUnload := &WorkerUnload{Model: "m", SentMS: load.SentMS, Sig: controlMAC(key, "load", "w1", load.SentMS, "m")}
	if err := asUnload.Verify(key, "w1", now); CodeOf(err) != CodeBadRequest {
		t.Errorf("a load's signature on an unload: %v", err)
	}
}
