package codec

import (
	"crypto/sha256"
	"encoding/hex"
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
// holder, wait_ms}; renew {lease, ttl_ms, and bytes to ask for relief}; release {lease}.
type LeaseRequest struct {
	Action string `msgpack:"action" json:"action"`
	Lease  string `msgpack:"lease,omitempty" json:"lease,omitempty"`
	Device string `msgpack:"device,omitempty" json:"device,omitempty"`
	// Bytes: an acquire's size; in a renew, when set, the holder asks for relief: its
	// lease back at these bytes (at most the acquire's) once nothing presses its device
	// (gateway/relief.go), LeaseReply.Relief saying so.
	Bytes  int64  `msgpack:"bytes,omitempty" json:"bytes,omitempty"`
	Class  string `msgpack:"class,omitempty" json:"class,omitempty"`
	TTLMS  int64  `msgpack:"ttl_ms,omitempty" json:"ttl_ms,omitempty"`
	Holder string `msgpack:"holder,omitempty" json:"holder,omitempty"`
	// Gate (acquire): the holder follows the device's compute gate (gateway/gate.go):
	// the gateway publishes the gate of the lease's device while such a lease is held.
	Gate bool `msgpack:"gate,omitempty" json:"gate,omitempty"`
	// Reclaim (acquire): the holder gives memory back on demand (an on-pressure hook):
	// a higher class refused for memory on the device presses the lease (lease.go).
	Reclaim bool `msgpack:"reclaim,omitempty" json:"reclaim,omitempty"`
	// PID and Host (acquire, renew): the holder's process and its host, whose measured
	// usage (and its descendants') a pressed lease is shrunk to.
	PID  int    `msgpack:"pid,omitempty" json:"pid,omitempty"`
	Host string `msgpack:"host,omitempty" json:"host,omitempty"`
	// WaitMS (acquire): an acquire the device's budget cannot hold now waits in the
	// gateway up to this long (1 to MaxLeaseWaitMS; 0: answered at once), and is granted
	// on the event that makes room (gateway/leasewait.go).
	WaitMS int64 `msgpack:"wait_ms,omitempty" json:"wait_ms,omitempty"`
}

// MaxLeaseWaitMS bounds an acquire's wait_ms: five minutes.
const MaxLeaseWaitMS = 300_000

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
	// Gateway is the granting gateway's id: the gate a gated holder follows is
	// ortbus.gate.<gateway>.<device>.
	Gateway string `msgpack:"gateway,omitempty" json:"gateway,omitempty"`
	// Gate and Reclaim are the acquire's.
	Gate    bool `msgpack:"gate,omitempty" json:"gate,omitempty"`
	Reclaim bool `msgpack:"reclaim,omitempty" json:"reclaim,omitempty"`
	// Pressed: a higher class wants this reclaimable lease's memory back (lease.go).
	Pressed bool `msgpack:"pressed,omitempty" json:"pressed,omitempty"`
	// Relief (the reply to a renew with bytes): nothing presses the lease's device any
	// more and the lease holds the bytes asked again: its holder may take its memory back
	// (gateway/relief.go).
	Relief bool `msgpack:"relief,omitempty" json:"relief,omitempty"`
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
		if r.Bytes < 0 || (r.Bytes > 0 && r.Action == LeaseRelease) {
			return bad("bytes", "%d: a renew may ask for bytes > 0 back (relief); a release takes none", r.Bytes)
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
	if r.WaitMS < 0 || r.WaitMS > MaxLeaseWaitMS {
		return bad("wait_ms", "%d is not within 0 to %d", r.WaitMS, MaxLeaseWaitMS)
	}
	if r.WaitMS != 0 && r.Action != LeaseAcquire {
		return bad("wait_ms", "only an acquire waits")
	}
	if r.PID < 0 || r.PID > 1<<22 {
		return bad("pid", "%d is not a process id", r.PID)
	}
	if len(r.Host) > 255 || strings.IndexFunc(r.Host, func(c rune) bool { return c <= ' ' || c >= 0x7f }) >= 0 {
		return bad("host", "not a host name (printable ASCII, at most 255 bytes)")
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
// paused on the device by its owner; Resumed in the reply to resume. Owner is whose it is
// and whose work it holds: an application's account ("account:NAME"), which pauses only
// its own work, or "" for the operator's, which holds everyone's.
type PauseReply struct {
	Class       string `msgpack:"class" json:"class"`
	Device      string `msgpack:"device,omitempty" json:"device,omitempty"`
	Owner       string `msgpack:"owner,omitempty" json:"owner,omitempty"`
	UntilUnixMS int64  `msgpack:"until_unix_ms,omitempty" json:"until_unix_ms,omitempty"`
	Resumed     bool   `msgpack:"resumed,omitempty" json:"resumed,omitempty"`
}

// Gate is the compute gate of one device, as a gateway decides it (gateway/gate.go) and
// publishes it on ortbus.gate.<gateway>.<device>: while Closed, work of the gating class
// (or a higher one) is queued for or running on the device, and the processes of gated
// leases there pause (within their own limits: max-pause, min-share). A gate state holds
// for TTLMS from its receipt; none newer by then, it is open. Seq orders one gateway's
// states of the device. Reclaim lists the tags (LeaseTag) of the device's reclaimable
// leases that a higher class presses to give memory back.
type Gate struct {
	Gateway string   `msgpack:"gateway" json:"gateway"`
	Device  string   `msgpack:"device" json:"device"`
	Seq     uint64   `msgpack:"seq" json:"seq"`
	Closed  bool     `msgpack:"closed,omitempty" json:"closed,omitempty"`
	Class   string   `msgpack:"class,omitempty" json:"class,omitempty"`
	TTLMS   int64    `msgpack:"ttl_ms" json:"ttl_ms"`
	Reclaim []string `msgpack:"reclaim,omitempty" json:"reclaim,omitempty"`
}

// MaxGateTTLMS bounds how long a receiver lets one gate state hold, whatever its ttl_ms
// says; MaxGateReclaim bounds its reclaim list.
const (
	MaxGateTTLMS   = 2000
	MaxGateReclaim = 1024
)

// Validate checks a gate state from the wire.
func (g *Gate) Validate() error {
	bad := badField
	if g.TTLMS <= 0 || g.TTLMS > MaxGateTTLMS {
		return bad("ttl_ms", "%d: want 1 to %d", g.TTLMS, MaxGateTTLMS)
	}
	if len(g.Reclaim) > MaxGateReclaim {
		return bad("reclaim", "%d tags, over the limit of %d", len(g.Reclaim), MaxGateReclaim)
	}
	for _, tag := range g.Reclaim {
		if len(tag) != LeaseTagLen {
			return bad("reclaim", "a tag of %d bytes, want %d", len(tag), LeaseTagLen)
		}
	}
	return checkNames(field{"gateway", g.Gateway}, field{"device", g.Device}, field{"class", g.Class})
}

// LeaseTagLen is the length of a lease's tag.
const LeaseTagLen = 16

// LeaseTag names a lease in public (a gate's reclaim list) without its id, which is the
// holder's capability: the first 16 hex digits of the SHA-256 of the id.
func LeaseTag(lease string) string {
	sum := sha256.Sum256([]byte(lease))
	return hex.EncodeToString(sum[:])[:LeaseTagLen]
}

// GateStatus is one device's gate in a status reply: the gating class, whether it is
// closed (gated tenants paused) now, and the share of the last minute it was closed.
type GateStatus struct {
	Device        string  `msgpack:"device" json:"device"`
	Class         string  `msgpack:"class" json:"class"`
	Paused        bool    `msgpack:"paused" json:"paused"`
	PausedShare1m float64 `msgpack:"paused_share_1m" json:"paused_share_1m"`
	// PausedTotalMS is the time the gate was closed since it came to be (the device's
	// first gated or pressed lease, while such leases are held without a gap).
	PausedTotalMS int64  `msgpack:"paused_total_ms" json:"paused_total_ms"`
	Seq           uint64 `msgpack:"seq" json:"seq"`
	Tenants       int    `msgpack:"tenants" json:"tenants"`
}
