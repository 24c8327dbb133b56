package main

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// TestLeaseWaitFlag: --wait takes a duration (the gateway's wait, not a bool); a negative
// one, or none before "--", is a usage error.
func TestLeaseWaitFlag(t *testing.T) {
	stderr := os.Stderr
	null, _ := os.Open(os.DevNull)
	os.Stderr = null
	defer func() { os.Stderr = stderr; null.Close() }()
	base := []string{"--device", "cpu", "--bytes", "1MiB"}
	o, ok := parseLeaseFlags(append(append(base, "--wait", "2m"), "--", "true"))
	if !ok || o.wait != 2*time.Minute {
		t.Fatalf("--wait 2m: %+v %v", o, ok)
	}
	if o, ok := parseLeaseFlags(append(base, "--", "true")); !ok || o.wait != 0 {
		t.Errorf("no --wait: %+v %v, want no wait", o, ok)
	}
	for _, bad := range [][]string{{"--wait", "-1s", "--", "true"}, {"--wait", "--", "true"}} {
		if _, ok := parseLeaseFlags(append(append([]string{}, base...), bad...)); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestWaitedOut: only an overloaded answer that says how long it waited is a wait that
// ran out (the wrapper waits again); an overloaded refusal at once (the waiters' bound) or
// any other error is not.
func TestWaitedOut(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{codec.Errorf(codec.CodeOverloaded, "x").With("waited_ms", 300000), true},
		{codec.Errorf(codec.CodeOverloaded, "x").With("limit", 256), false},
		{codec.Errorf(codec.CodeBadRequest, "x").With("waited_ms", 1), false},
		{errors.New("nats: timeout"), false},
	} {
		if got := waitedOut(c.err); got != c.want {
			t.Errorf("waitedOut(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
