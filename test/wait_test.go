package test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// checkFor is the one polling wait of the package (nats-server's checkFor): it calls f
// until f returns nil, at most one try every `every` (a try that took longer is followed
// by the next at once), and fails t with what and f's last error once total has passed
// since the first try. f runs on the caller's goroutine, so it may call t.Fatal itself.
//
// Waits for an event (a reply, a claim, a process exit) do not poll: they read channels
// with a deadline. checkFor is for state that has no push event (status, /metrics).
func checkFor(t testing.TB, what string, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		try := time.Now()
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, total, err)
		}
		if d := every - time.Since(try); d > 0 {
			time.Sleep(d)
		}
	}
}

// pollEvery is how often checkFor's callers poll state that has no push event.
const pollEvery = 20 * time.Millisecond

// lastStatus is the error of a status poll that ok has not accepted yet: the last status
// seen, written out (as indented JSON) only when the wait fails.
type lastStatus struct{ st *codec.StatusReply }

func (e lastStatus) Error() string {
	b, _ := json.MarshalIndent(e.st, "", "  ")
	return "last status:\n" + string(b)
}
