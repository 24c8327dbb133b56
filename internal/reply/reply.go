// Package reply is the one home of the contract's reply messages on NATS: a result body,
// or an error with micro's headers (Nats-Service-Error-Code / Nats-Service-Error) and a
// {code, message, details} body. Workers, the gateway (and its failover), the panic guard
// and the Go client write and read replies only through it.
package reply

import (
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
)

// The headers, micro's own names (codec.HeaderErrorCode and codec.HeaderError spell the
// same strings for packages that do not import nats).
const (
	HeaderErrorCode = micro.ErrorCodeHeader
	HeaderError     = micro.ErrorHeader
)

// Result is a reply message carrying an encoded result body.
func Result(subject string, body []byte, asJSON bool) *nats.Msg {
	m := nats.NewMsg(subject)
	if asJSON {
		m.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	}
	m.Data = body
	return m
}

// Error is the error reply of e: its HTTP-like status and message in the headers, the
// encoded error as the body.
func Error(subject string, e *codec.Error, asJSON bool) *nats.Msg {
	body, err := codec.Encode(e, asJSON)
	if err != nil {
		// Details that do not encode (they never come from the wire) are dropped.
		body, _ = codec.Encode(&codec.Error{Code: e.Code, Message: e.Message}, asJSON)
	}
	m := Result(subject, body, asJSON)
	m.Header.Set(HeaderErrorCode, strconv.Itoa(e.Code.Status()))
	m.Header.Set(HeaderError, headerText(e.Message))
	return m
}

// headerText keeps a header value on one line and short: a message may quote the
// client's input.
func headerText(s string) string {
	const max = 1024
	b := []byte(s)
	if len(b) > max {
		b = b[:max]
	}
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}

// ErrorOf returns the error of a reply message, or nil when it carries a result. An
// error reply whose body is not a contract error becomes internal, keeping its status.
func ErrorOf(m *nats.Msg) *codec.Error {
	code := m.Header.Get(HeaderErrorCode)
	if code == "" {
		return nil
	}
	var e codec.Error
	asJSON := m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON
	if len(m.Data) == 0 || codec.Decode(m.Data, &e, asJSON) != nil || !e.Code.Known() {
		n, _ := strconv.Atoi(code)
		return &codec.Error{Code: codec.CodeInternal, Message: m.Header.Get(HeaderError), Details: map[string]any{"status": n}}
	}
	return &e
}

// Fit returns m, or when its body is over max bytes (the server's max_payload, less
// room for headers), the reply_too_large error in its place: a result too large to send
// is answered, never dropped.
func Fit(m *nats.Msg, max int64) *nats.Msg {
	if e := TooLarge(len(m.Data), max); e != nil {
		return Error(m.Subject, e, m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON)
	}
	return m
}

// TooLarge is the reply_too_large error for a reply body of n bytes on a bus whose
// max_payload is max (less room for headers), or nil when it fits (or max is unknown).
// Its message names the way out: what does not fit inline is infer's outputs, which the
// request can have written as .npy files instead (output_dir, output_paths).
func TooLarge(n int, max int64) *codec.Error {
	if max <= 0 || int64(n) <= max-headerRoom {
		return nil
	}
	return codec.Errorf(codec.CodeReplyTooLarge, "the reply is %d bytes, over the bus's limit of %d: ask for fewer outputs, or have them written as .npy files instead of inline (infer: output_dir or output_paths)", n, max-headerRoom).
		With("bytes", n).With("max_bytes", max-headerRoom)
}

// headerRoom is what Fit keeps free of a max_payload for a reply's headers.
const headerRoom = 4096

// Send publishes a reply (fitted to the connection's max payload) and reports whether
// it left; a failure is the caller's to count and log.
func Send(nc *nats.Conn, m *nats.Msg) error {
	return nc.PublishMsg(Fit(m, nc.MaxPayload()))
}
