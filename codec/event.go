package codec

import (
	"bytes"
	"encoding/json"
)

// Event is the one JSON line a binary prints on stdout when it is ready, or when it cannot
// start (docs/PROTOCOL.md, section 5). It is not a bus message: it travels from a child
// process to whoever started it (the gateway's supervisor, the demo, benches, tests). Each
// binary fills only its own fields; empty ones are left out.
type Event struct {
	// Event is EventReady, EventFailed or EventLoading.
	Event string `json:"event"`
	// Model is the model an ortworker is about to load (EventLoading).
	Model string `json:"model,omitempty"`

	// ortworker: who it is and what it runs.
	Worker  string `json:"worker,omitempty"`
	Pool    string `json:"pool,omitempty"`
	Runtime string `json:"runtime,omitempty"`
	EP      string `json:"ep,omitempty"`
	PID     int    `json:"pid,omitempty"`

	// gateway and natsembed: where to reach them.
	NATSURL string `json:"nats_url,omitempty"`
	HTTP    string `json:"http,omitempty"`
	Cluster string `json:"cluster,omitempty"`
	Monitor string `json:"monitor,omitempty"`

	// Error is why the binary cannot start (with EventFailed).
	Error *Error `json:"error,omitempty"`
}

// Event kinds.
const (
	EventReady  = "ready"
	EventFailed = "failed"
	// EventLoading: an ortworker is about to load Model. Its supervisor remembers it: a
	// worker that dies before it is ready died of that model, which its restarts skip.
	EventLoading = "loading"
)

// Line is the event as its line on stdout, newline included.
func (e Event) Line() []byte {
	b, err := json.Marshal(e)
	if err != nil && e.Error != nil { // details JSON cannot hold (a NaN, say): keep the rest
		e.Error = &Error{Code: e.Error.Code, Message: e.Error.Message}
		b, _ = json.Marshal(e)
	}
	return append(b, '\n')
}

// Settles reports whether e says how a binary's start ended (ready or failed), as a
// "loading" progress line does not.
func (e Event) Settles() bool { return e.Event == EventReady || e.Event == EventFailed }

// ReadEvent reads one line of a binary's stdout. It reports false for a line that is not
// an event line (not a JSON object, or one without "event").
func ReadEvent(line []byte) (Event, bool) {
	var e Event
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Event == "" {
		return Event{}, false
	}
	return e, true
}
