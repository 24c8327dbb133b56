package gateway

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestEvery: f runs on each tick until stop; once stop has returned, f has returned and
// is never called again.
func TestEvery(t *testing.T) {
	var calls atomic.Int64
	ticked := make(chan struct{}, 16)
	stop := every(time.Millisecond, func(time.Time) {
		calls.Add(1)
		select {
		case ticked <- struct{}{}:
		default:
		}
	})
	for range 3 {
		<-ticked
	}
	stop()
	n := calls.Load()
	if n < 3 {
		t.Fatalf("%d calls before stop, want 3 or more", n)
	}
	// Nothing runs after stop returned: the goroutine has exited (stop waits for it).
	for range 5 {
		select {
		case <-ticked:
		default:
		}
	}
	if calls.Load() != n {
		t.Errorf("f called after stop returned: %d calls, %d at stop", calls.Load(), n)
	}
}
