// Package codec defines every message on the ortbus bus — requests and replies of each
// client op, the worker's work item, claims, heartbeats, cancels and the error body with
// its stable codes — and how they are encoded: msgpack with string keys and snake_case
// names by default, JSON when a request carries `Content-Type: application/json`.
//
// Decoding untrusted bytes never panics: any failure is a *Error with code bad_request.
package codec

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// ContentTypeJSON is the Content-Type header value that selects JSON.
const ContentTypeJSON = "application/json"

// Marshal encodes v as msgpack. Small integers are written compactly so that JavaScript
// reads them as plain numbers, not bigints.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	enc.UseCompactFloats(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	return buf.Bytes(), nil
}

// Unmarshal decodes msgpack bytes into v, after the bounds walk of bound.go. Any failure,
// including a panic inside the decoder on hostile input, is returned as a bad_request
// *Error.
func Unmarshal(data []byte, v any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Errorf(CodeBadRequest, "malformed msgpack: %v", r)
		}
	}()
	if len(data) == 0 {
		return Errorf(CodeBadRequest, "empty message body")
	}
	if err := checkMsgpack(data); err != nil {
		return Errorf(CodeBadRequest, "malformed msgpack: %v", err)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeBadRequest, "malformed msgpack: %v", err)
	}
	return checkVersion(v)
}

// Encode encodes v as JSON when asJSON is set, else as msgpack.
func Encode(v any, asJSON bool) ([]byte, error) {
	if asJSON {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encode %T as JSON: %w", v, err)
		}
		return b, nil
	}
	return Marshal(v)
}

// Decode decodes JSON when asJSON is set, else msgpack; failures are bad_request.
func Decode(data []byte, v any, asJSON bool) error {
	if !asJSON {
		return Unmarshal(data, v)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return Errorf(CodeBadRequest, "empty message body")
	}
	if err := checkJSON(data); err != nil {
		return Errorf(CodeBadRequest, "malformed JSON: %v", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return Errorf(CodeBadRequest, "malformed JSON: %v", err)
	}
	return checkVersion(v)
}

// versioned is implemented by messages that carry a wire version.
type versioned interface{ wireVersion() int }

func (r *Request) wireVersion() int   { return r.V }
func (h *Heartbeat) wireVersion() int { return h.V }

func checkVersion(v any) error {
	if m, ok := v.(versioned); ok {
		if w := m.wireVersion(); w > WireVersion {
			return Errorf(CodeBadRequest, "wire version %d is newer than this server's %d", w, WireVersion).With("v", w)
		}
	}
	return nil
}

// Header names: micro-style error replies carry the error's HTTP-like status and text;
// Content-Type selects JSON. Ortbus-Resend marks a request a client sends again after a
// gateway died; Ortbus-Held is a gateway's notice (empty body) that such a request is
// still held by the live gateway it names, whose answer the client waits for.
const (
	HeaderErrorCode   = "Nats-Service-Error-Code"
	HeaderError       = "Nats-Service-Error"
	HeaderContentType = "Content-Type"
	HeaderResend      = "Ortbus-Resend"
	HeaderHeld        = "Ortbus-Held"
)
