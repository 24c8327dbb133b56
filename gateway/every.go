package gateway

import "time"

// every calls f with the tick's time every d, on a goroutine of its own, until the returned
// stop is called; stop returns once f's last call has returned, and f is not called after.
// The samplers and deciders that run on a clock (classWindow, gates, foreignReaders) share
// it.
func every(d time.Duration, f func(now time.Time)) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				f(now)
			}
		}
	}()
	return func() { close(done); <-exited }
}
