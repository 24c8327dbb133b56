package codec

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Leases: memory on a device held by a process ortbus does not run (an LLM server, a
// game), so that it takes part in the same memory admission as ortbus's own workers
// (gateway/lease.go).

// Lease actions.
const (
	LeaseAcquire = "acquire"
	LeaseRenew   = "renew"
	LeaseRelease = "release"
)

// LeaseRequest is the body of ortbus.v1.lease: acquire {device, bytes, class, ttl_ms,
// holder}; renew {lease, ttl_ms}; release {lease}.
type LeaseRequest struct {
	Action string `msgpack:"action" json:"action"`
	Lease  string `msgpack:"lease,omitempty" json:"lease,omitempty"`
	Device string `msgpack:"device,omitempty" json:"device,omitempty"`
	Bytes  int64  `msgpack:"bytes,omitempty" json:"bytes,omitempty"`
	Class  string `msgpack:"class,omitempty" json:"class,omitempty"`
	TTLMS  int64  `msgpack:"ttl_ms,omitempty" json:"ttl_ms,omitempty"`
	Holder string `msgpack:"holder,omitempty" json:"holder,omitempty"`
}

// LeaseReply is a lease as granted, renewed or released (and as status lists it).
type LeaseReply struct {
	Lease         string `msgpack:"lease,omitempty" json:"lease,omitempty"` // not in status: it is the holder's capability
	Device        string `msgpack:"device" json:"device"`
	Bytes         int64  `msgpack:"bytes" json:"bytes"`
	Class         string `msgpack:"class" json:"class"`
	Holder        string `msgpack:"holder,omitempty" json:"holder,omitempty"`
	ExpiresUnixMS int64  `msgpack:"expires_unix_ms" json:"expires_unix_ms"`
	// Released is set in the reply to release.
	Released bool `msgpack:"released,omitempty" json:"released,omitempty"`
}

// Validate checks a lease request from the wire.
func (r *LeaseRequest) Validate() error {
	bad := badField
	switch r.Action {
	case LeaseAcquire:
		if r.Device == "" {
			return bad("device", "acquire needs a device")
		}
		if r.Bytes <= 0 {
			return bad("bytes", "acquire needs bytes > 0, got %d", r.Bytes)
		}
	case LeaseRenew, LeaseRelease:
		if err := CheckID("lease", r.Lease); err != nil {
			return bad("lease", "%v", err)
		}
	default:
		if len(r.Action) > MaxIDLen {
			return bad("action", "%d bytes long, over the limit of %d", len(r.Action), MaxIDLen)
		}
		return bad("action", "%q: want acquire, renew or release", r.Action)
	}
	if r.TTLMS < 0 {
		return bad("ttl_ms", "%d is negative", r.TTLMS)
	}
	if err := checkNames(field{"device", r.Device}, field{"class", r.Class}, field{"holder", r.Holder}); err != nil {
		return err
	}
	// The holder is shown in status: printable text only.
	if !utf8.ValidString(r.Holder) || strings.IndexFunc(r.Holder, func(c rune) bool { return !unicode.IsPrint(c) }) >= 0 {
		return bad("holder", "not printable UTF-8 text")
	}
	return nil
}

// PauseRequest pauses or resumes a class on demand (op pause): action "pause" (default)
// or "resume"; class (required); device ("" = every device); for_ms, with pause, how
// long (required: 1 s to an hour).
type PauseRequest struct {
	Action string `msgpack:"action,omitempty" json:"action,omitempty"`
	Class  string `msgpack:"class" json:"class"`
	Device string `msgpack:"device,omitempty" json:"device,omitempty"`
	ForMS  int64  `msgpack:"for_ms,omitempty" json:"for_ms,omitempty"`
}

// Pause actions.
const (
	PausePause  = "pause"
	PauseResume = "resume"
)

// PauseReply is a pause as it stands (and as status lists it): until when the class is
// paused on the device by this caller; Resumed in the reply to resume.
type PauseReply struct {
	Class       string `msgpack:"class" json:"class"`
	Device      string `msgpack:"device,omitempty" json:"device,omitempty"`
	UntilUnixMS int64  `msgpack:"until_unix_ms,omitempty" json:"until_unix_ms,omitempty"`
	Resumed     bool   `msgpack:"resumed,omitempty" json:"resumed,omitempty"`
}
