package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

// TestJSOpenerBounds: an attempt whose request is lost (it runs until its bound) costs
// the first, short bound, and the next attempt gets twice it (rules 1 and 2); an attempt
// that fails at once keeps its bound; the bound never passes attemptMax.
func TestJSOpenerBounds(t *testing.T) {
	o := jsOpener{attempt: 20 * time.Millisecond, attemptMax: 50 * time.Millisecond, wait: time.Millisecond, waitMax: time.Millisecond}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// What each attempt does: lost (waits for its bound), refused (fails at once), ok.
	script := []string{"lost", "refused", "lost", "lost", "ok"}
	want := []time.Duration{20, 40, 40, 50, 50} // each attempt's bound, in ms
	var bounds []time.Duration
	failed := 0
	ok := o.open(context.Background(), log, "thing", func(ctx context.Context) error {
		dl, has := ctx.Deadline()
		if !has {
			t.Fatal("an attempt without a bound")
		}
		bounds = append(bounds, time.Until(dl))
		switch script[len(bounds)-1] {
		case "lost":
			<-ctx.Done()
			return ctx.Err()
		case "refused":
			return errors.New("no JetStream")
		}
		return nil
	}, func(error) { failed++ })
	if !ok || len(bounds) != len(script) || failed != len(script)-1 {
		t.Fatalf("open %v after %d attempts, %d failures; want true after %d, %d", ok, len(bounds), failed, len(script), len(script)-1)
	}
	for i, b := range bounds {
		// The bound is taken before the call, so what is left of it at the call's start
		// is at most the bound, and more than the bound one step down.
		if w := want[i] * time.Millisecond; b > w || (i > 0 && w > want[i-1]*time.Millisecond && b <= want[i-1]*time.Millisecond) {
			t.Errorf("attempt %d (%s): bound %v, want %v", i+1, script[i], b, w)
		}
	}
}

// TestJSOpenerStops: the caller's context ending ends the attempts, false.
func TestJSOpenerStops(t *testing.T) {
	o := jsOpener{attempt: time.Hour, attemptMax: time.Hour, wait: time.Millisecond, waitMax: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	done := make(chan bool)
	go func() {
		done <- o.open(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), "thing", func(actx context.Context) error {
			n++
			if n == 2 {
				cancel()
				<-actx.Done()
				return actx.Err()
			}
			return errors.New("not yet")
		}, nil)
	}()
	if <-done {
		t.Fatal("open said true after its context ended")
	}
	if n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
}
