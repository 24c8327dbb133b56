// Package guard keeps a panic in one handler from ending the process. Every bus handler,
// HTTP handler, tracker callback and goroutine of the gateway and the worker defers
// Recover (or is wrapped by Msg): a panic there is stopped, counted (Panics, which
// the gateway exports as ortbus_panics_total and a worker reports in its heartbeat),
// logged once with its stack, and — where a reply is due — answered `internal`.
package guard

import (
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/subjects"
)

var panics atomic.Uint64

// Panics is how many panics this process has recovered.
func Panics() uint64 { return panics.Load() }

// Recover must be deferred directly (`defer guard.Recover(...)`). It stops a panic of the
// deferring function, counts and logs it, and calls answer with an internal error when
// answer is not nil.
func Recover(log *slog.Logger, where string, answer func(*codec.Error)) {
	v := recover()
	if v == nil {
		return
	}
	Count(log, where, v)
	if answer != nil {
		func() {
			defer func() { recover() }() // an answer that panics too is not retried
			answer(codec.Errorf(codec.CodeInternal, "internal error in %s", where))
		}()
	}
}

// Count counts and logs (with the stack) a panic value v that the caller recovered
// itself — recover works only when the deferred function calls it directly — for a
// caller that turns the panic into an error of its own (a model that panicked while
// loading is failed with it).
func Count(log *slog.Logger, where string, v any) {
	panics.Add(1)
	if log == nil {
		log = slog.Default()
	}
	log.Error("panic recovered", "where", where, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
}

// Msg wraps a subscription handler: a panic is recovered, and a message with a reply
// subject under one of replies (subjects.CheckReply) is answered internal. Handlers of
// messages that are never answered (heartbeats, claims, beats) pass nil: a reply subject
// on them is never published to.
func Msg(log *slog.Logger, where string, nc *nats.Conn, replies []string, h nats.MsgHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
		defer Recover(log, where, func(e *codec.Error) {
			if m.Reply != "" && subjects.CheckReply(m.Reply, replies) == nil {
				asJSON := m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON
				reply.Send(nc, reply.Error(m.Reply, e, asJSON))
			}
		})
		h(m)
	}
}
