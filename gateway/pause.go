package gateway

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// Pauses on demand (op pause): an app pauses a class — batch, while a voice session or a
// security event lasts — on one device or on every device, for a bounded time.
//
//  1. A paused class's queued work waits: a dispatch pass sends none of it to a pool on a
//     device where the class is paused (capacity.pausedOn, route), nor wakes a sleeping
//     pool for it. What already runs finishes. Its deadlines still hold. As any waiting
//     item (sched, rule 2), a paused item keeps its pools from the classes below it: a
//     paused interactive class holds batch back on its pools too.
//  2. Jobs of a paused class take no new items where it is paused (jobRoom).
//  3. Expiry is mandatory: a pause lasts 1 s to maxPauseFor, so a crashed app cannot pause
//     a class for good. Pausing again extends (replaces) the caller's own pause.
//  4. A pause has an owner (identity.go): resume ends only the caller's own, and the class
//     stays paused while anyone's pause lasts. At most maxPauses pauses are held at once,
//     a tenant at most its share of them (tenantBound).
//  5. A tenant (an application's account) pauses only background classes (batch): a
//     pause holds back everyone's work of its class, and one app may not hold back the
//     urgent or interactive work of another. The local owner (operators, and every client
//     under identity = "local") may pause any class.
type pauses struct {
	mu sync.Mutex
	by map[pauseKey]time.Time // until
}

type pauseKey struct{ class, device, owner string }

// The bounds of pauses.
const (
	maxPauseFor = time.Hour
	minPauseFor = time.Second
	maxPauses   = 256
)

func newPauses() *pauses { return &pauses{by: map[pauseKey]time.Time{}} }

// pauseNow is the pauses' clock (a test's own).
var pauseNow = time.Now

// pause applies a pause request of owner (tenant, or "" for the local owner).
func (g *Gateway) pause(req *codec.PauseRequest, owner string) (*codec.PauseReply, *codec.Error) {
	cfg := g.conf()
	if _, ok := cfg.Classes[req.Class]; !ok {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q (classes: %v)", req.Class, cfg.ClassNames()).With("field", "class")
	}
	if owner != "" && cfg.Classes[req.Class].Priority < backgroundPriority {
		return nil, codec.Errorf(codec.CodeBadRequest, "class %s: an application pauses only background classes (priority %d and up)", req.Class, backgroundPriority).With("field", "class")
	}
	if req.Device != "" && !g.knownDevice(req.Device) {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown device %q (devices: %v)", req.Device, g.deviceNames()).With("field", "device")
	}
	ps, now := g.pauses, pauseNow()
	key := pauseKey{req.Class, req.Device, owner}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	switch cmp.Or(req.Action, codec.PausePause) {
	case codec.PauseResume:
		_, had := ps.by[key]
		delete(ps.by, key)
		return &codec.PauseReply{Class: req.Class, Device: req.Device, Resumed: had}, nil
	case codec.PausePause:
	default:
		return nil, codec.Errorf(codec.CodeBadRequest, "action %q: want pause or resume", req.Action).With("field", "action")
	}
	d := time.Duration(req.ForMS) * time.Millisecond
	if req.ForMS <= 0 || d < minPauseFor || req.ForMS > maxPauseFor.Milliseconds() {
		return nil, codec.Errorf(codec.CodeBadRequest, "for_ms: a pause must say how long, from %s to %s (it ends on its own)", minPauseFor, maxPauseFor).With("field", "for_ms")
	}
	if _, renew := ps.by[key]; !renew {
		if len(ps.by) >= maxPauses {
			return nil, codec.Errorf(codec.CodeOverloaded, "%d pauses are held; try again when one ends", len(ps.by))
		}
		if owner != "" && ps.heldBy(owner) >= tenantBound(maxPauses) {
			return nil, codec.Errorf(codec.CodeOverloaded, "you hold %d pauses, your bound", tenantBound(maxPauses))
		}
	}
	until := now.Add(d)
	ps.by[key] = until
	g.kick()
	return &codec.PauseReply{Class: req.Class, Device: req.Device, UntilUnixMS: until.UnixMilli()}, nil
}

// expire drops the pauses past their time: ps.mu held.
func (ps *pauses) expire(now time.Time) {
	for k, until := range ps.by {
		if !now.Before(until) {
			delete(ps.by, k)
		}
	}
}

// heldBy counts owner's pauses: ps.mu held.
func (ps *pauses) heldBy(owner string) int {
	n := 0
	for k := range ps.by {
		if k.owner == owner {
			n++
		}
	}
	return n
}

// active is what is paused at now: for each class, the devices ("" = every device).
func (ps *pauses) active(now time.Time) map[string]map[string]bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	out := map[string]map[string]bool{}
	for k := range ps.by {
		if out[k.class] == nil {
			out[k.class] = map[string]bool{}
		}
		out[k.class][k.device] = true
	}
	return out
}

// list is every pause, for status: per class and device, the latest end.
func (ps *pauses) list(now time.Time) []codec.PauseReply {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	latest := map[[2]string]time.Time{}
	for k, until := range ps.by {
		kk := [2]string{k.class, k.device}
		if until.After(latest[kk]) {
			latest[kk] = until
		}
	}
	var out []codec.PauseReply
	for k, until := range latest {
		out = append(out, codec.PauseReply{Class: k[0], Device: k[1], UntilUnixMS: until.UnixMilli()})
	}
	slices.SortFunc(out, func(a, b codec.PauseReply) int {
		return cmp.Or(cmp.Compare(a.Class, b.Class), cmp.Compare(a.Device, b.Device))
	})
	return out
}

// pausedOn reports whether class is paused on pool's device at the snapshot (rule 1).
func (c *capacity) pausedOn(class, pool string) bool {
	d := c.paused[class]
	return d != nil && (d[""] || d[c.cfg.Pool(pool).Device])
}
