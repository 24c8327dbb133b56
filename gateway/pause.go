package gateway

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// Pauses on demand (op pause): an app pauses a class — batch, while a voice session or a
// security event lasts — on one device or on every device, for a bounded time.
//
//  1. A paused class's queued work waits: a dispatch pass sends none of it to a pool on a
//     device where the class is paused for it (capacity.pausedOn, route), nor wakes a
//     sleeping pool for it. What already runs finishes. Its deadlines still hold. As any
//     waiting item (sched, rule 2), a paused item keeps its pools from the classes below
//     it: a paused interactive class holds batch back on its pools too.
//  2. Jobs of a paused class take no new items where the operator paused it (jobRoom);
//     a job item taken while its owner's own pause lasts waits as rule 1 says.
//  3. Expiry is mandatory: a pause lasts 1 s to maxPauseFor, so a crashed app cannot pause
//     a class for good. Pausing again extends (replaces) the caller's own pause.
//  4. A pause has an owner (account.go): resume ends only the caller's own, and the class
//     stays paused while anyone's pause lasts. At most maxPauses pauses are held at once,
//     an account at most its share of them (accountBound).
//  5. An account (an application's account) pauses only background classes (batch), and
//     only its own work: its pause holds its own requests (and its jobs' items, where
//     the job runner names their owner: pending.jobOwner) and nobody else's, so that one
//     app never holds back another's work. The local owner (operators, and every client
//     under identity = "local") may pause any class, and its pause holds everyone's work.
//  6. Status lists each pause with its owner (PauseReply.Owner, "" for the operator's): a
//     account sees its own and the operator's, the pauses that hold its work; the operator
//     sees every one.
type pauses struct {
	mu   sync.Mutex
	by   map[pauseKey]time.Time // until
	kick func()                 // a pass of the dispatch loop, wired at construction
}

// The bounds of pauses.
const (
	maxPauseFor = time.Hour
	minPauseFor = time.Second
	maxPauses   = 256
)

// newPauses are the pauses; kick asks the dispatch loop for a pass (a pause taken).
func newPauses(kick func()) *pauses { return &pauses{by: map[pauseKey]time.Time{}, kick: kick} }

// pauseNow is the pauses' clock (a test's own).
var pauseNow = time.Now

// pause applies a pause request of owner (account, or "" for the local owner).
func (ps *pauses) pause(cfg *config.Config, req *codec.PauseRequest, owner string) (*codec.PauseReply, *codec.Error) {
	if _, ok := cfg.Classes[req.Class]; !ok {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q (classes: %v)", req.Class, cfg.ClassNames()).With("field", "class")
	}
	if owner != "" && cfg.Classes[req.Class].Priority < backgroundPriority {
		return nil, codec.Errorf(codec.CodeBadRequest, "class %s: an application pauses only background classes (priority %d and up)", req.Class, backgroundPriority).With("field", "class")
	}
	if req.Device != "" && !knownDevice(cfg, req.Device) {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown device %q (devices: %v)", req.Device, deviceNames(cfg)).With("field", "device")
	}
	now := pauseNow()
	key := pauseKey{req.Class, req.Device, owner}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	switch cmp.Or(req.Action, codec.PausePause) {
	case codec.PauseResume:
		_, had := ps.by[key]
		delete(ps.by, key)
		return &codec.PauseReply{Class: req.Class, Device: req.Device, Owner: owner, Resumed: had}, nil
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
		if owner != "" && ps.heldBy(owner) >= accountBound(maxPauses) {
			return nil, codec.Errorf(codec.CodeOverloaded, "you hold %d pauses, your bound", accountBound(maxPauses))
		}
	}
	until := now.Add(d)
	ps.by[key] = until
	ps.kick()
	return &codec.PauseReply{Class: req.Class, Device: req.Device, Owner: owner, UntilUnixMS: until.UnixMilli()}, nil
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

// active is what the operator paused at now, which holds everyone's work: for each
// class, the devices ("" = every device). The job runner's intake stops there (rule 2).
func (ps *pauses) active(now time.Time) map[string]map[string]bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	out := map[string]map[string]bool{}
	for k := range ps.by {
		if k.owner != "" {
			continue // an account's pause holds only its own work (rule 5)
		}
		if out[k.class] == nil {
			out[k.class] = map[string]bool{}
		}
		out[k.class][k.device] = true
	}
	return out
}

// held is every pause in force at now, for a dispatch pass (rule 1).
func (ps *pauses) held(now time.Time) pauseSet {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	out := pauseSet{}
	for k := range ps.by {
		out[k] = true
	}
	return out
}

// list is the pauses status shows viewer (an account, "" for the operator): per class,
// device and owner, its end; an account sees its own and the operator's (rule 6).
func (ps *pauses) list(now time.Time, viewer string) []codec.PauseReply {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.expire(now)
	var out []codec.PauseReply
	for k, until := range ps.by {
		if viewer != "" && k.owner != "" && k.owner != viewer {
			continue // another account's: it holds none of viewer's work
		}
		out = append(out, codec.PauseReply{Class: k.class, Device: k.device, Owner: k.owner, UntilUnixMS: until.UnixMilli()})
	}
	slices.SortFunc(out, func(a, b codec.PauseReply) int {
		return cmp.Or(cmp.Compare(a.Class, b.Class), cmp.Compare(a.Device, b.Device), cmp.Compare(a.Owner, b.Owner))
	})
	return out
}

// ownPaused is the pools of pools (those that can serve p's model) where p's class is
// paused for it by its owner's own pause alone, not the operator's (rule 5); nil for
// none. p waits for them without holding them (or their devices) from anyone else's
// work, since one app's pause of its own work never holds back another's.
func (c *capacity) ownPaused(class string, pools []string, p *pending) map[string]bool {
	owner := p.workOwner()
	if owner == "" || len(c.paused) == 0 {
		return nil
	}
	var own map[string]bool
	for _, pool := range pools {
		dev := c.cfg.Pool(pool).Device
		if c.modelDown(pool, p.req.Model) == nil && c.paused.holds(class, dev, owner) && !c.paused.holds(class, dev, "") {
			if own == nil {
				own = map[string]bool{}
			}
			own[pool] = true
		}
	}
	return own
}

// pausedOn reports whether class is paused on pool's device for p's work at the
// snapshot (rules 1 and 5).
func (c *capacity) pausedOn(class, pool string, p *pending) bool {
	return c.paused.holds(class, c.cfg.Pool(pool).Device, p.workOwner())
}
