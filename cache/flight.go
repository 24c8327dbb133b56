package cache

import (
	"context"
	"sync"
)

// Flights makes one computation of a key at a time in this gateway: the first request
// for a key leads (computes it), the others that come while it runs wait for its answer
// (identical files inside one job are computed once). Entries live only while their
// leader runs, so they are bounded by the requests in flight.
type Flights struct {
	mu sync.Mutex
	m  map[string]*Flight
}

// Flight is one key's computation in progress.
type Flight struct {
	done chan struct{}
	body []byte
}

// Join returns key's flight, and whether the caller leads it (then it must Finish it).
func (fs *Flights) Join(key string) (f *Flight, leader bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m == nil {
		fs.m = map[string]*Flight{}
	}
	if f, ok := fs.m[key]; ok {
		return f, false
	}
	f = &Flight{done: make(chan struct{})}
	fs.m[key] = f
	return f, true
}

// Finish ends the leader's flight with its answer (nil: none to share; the waiters then
// compute it themselves).
func (fs *Flights) Finish(key string, f *Flight, body []byte) {
	fs.mu.Lock()
	if fs.m[key] == f {
		delete(fs.m, key)
	}
	fs.mu.Unlock()
	f.body = body
	close(f.done)
}

// Wait waits for the leader's answer: nil when it had none to share or ctx ended.
func (f *Flight) Wait(ctx context.Context) []byte {
	select {
	case <-f.done:
		return f.body
	case <-ctx.Done():
		return nil
	}
}

// Len is how many flights run (for tests).
func (fs *Flights) Len() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.m)
}
