package codec

import (
	"math"
	"testing"

	"github.com/ortbus/ortbus/subjects"
)

// TestUnitEventLines: the lines each binary prints keep their keys (docs/PROTOCOL.md
// section 5), and ReadEvent reads them back and nothing else.
func TestEventLines(t *testing.T) {
	for _, c := range []struct {
		ev   Event
		want string
	}{
		{Event{Event: EventReady, Worker: "fast-0", Pool: "fast", Runtime: "1.30.0", EP: "cpu", PID: 42},
			`{"event":"ready","worker":"fast-0","pool":"fast","runtime":"1.30.0","ep":"cpu","pid":42}`},
		{Event{Event: EventFailed, Worker: "fast-0", Pool: "fast", Error: Errorf(CodeRuntimeMissing, "no library").With("searched", []string{"/a"})},
			`{"event":"failed","worker":"fast-0","pool":"fast","error":{"code":"runtime_missing","message":"no library","details":{"searched":["/a"]}}}`},
		{Event{Event: EventReady, NATSURL: "nats://127.0.0.1:4222", HTTP: "127.0.0.1:8080"},
			`{"event":"ready","nats_url":"nats://127.0.0.1:4222","http":"127.0.0.1:8080"}`},
		{Event{Event: EventReady, NATSURL: "nats://127.0.0.1:4222", Cluster: "127.0.0.1:6222", Monitor: "127.0.0.1:8222"},
			`{"event":"ready","nats_url":"nats://127.0.0.1:4222","cluster":"127.0.0.1:6222","monitor":"127.0.0.1:8222"}`},
	} {
		line := c.ev.Line()
		if string(line) != c.want+"\n" {
			t.Errorf("line %s, want %s", line, c.want)
		}
		got, ok := ReadEvent(line)
		if !ok || got.Event != c.ev.Event || got.Worker != c.ev.Worker || got.NATSURL != c.ev.NATSURL || got.PID != c.ev.PID ||
			(c.ev.Error != nil) != (got.Error != nil) || (got.Error != nil && got.Error.Code != c.ev.Error.Code) {
			t.Errorf("ReadEvent(%s) = %+v, %v", line, got, ok)
		}
	}
	for _, s := range []string{"", "time=... level=INFO msg=hello", "{}", `{"event":""}`, `{"event":1}`, "[1]", "{"} {
		if ev, ok := ReadEvent([]byte(s)); ok {
			t.Errorf("ReadEvent(%q) = %+v, want not an event", s, ev)
		}
	}
	// An error whose details JSON cannot hold still makes a line, without the details.
	bad := Event{Event: EventFailed, Error: Errorf(CodeInternal, "x").With("v", math.NaN())}
	if ev, ok := ReadEvent(bad.Line()); !ok || ev.Error == nil || ev.Error.Code != CodeInternal || ev.Error.Details != nil {
		t.Errorf("event with a NaN detail: %+v, %v", ev, ok)
	}
}

// TestEventSettles: ready and failed settle a start; loading does not.
func TestEventSettles(t *testing.T) {
	for ev, want := range map[string]bool{EventReady: true, EventFailed: true, EventLoading: false, "other": false} {
		if got := (Event{Event: ev}).Settles(); got != want {
			t.Errorf("%s settles: %v, want %v", ev, got, want)
		}
	}
}

// TestNewReplyEveryOp: every op of the client API has its reply type (a reply of an op
// without one could not be decoded by a client, nor re-encoded by the gateway).
func TestNewReplyEveryOp(t *testing.T) {
	for _, op := range subjects.Ops {
		if NewReply(op) == nil {
			t.Errorf("op %s has no reply type", op)
		}
	}
}
