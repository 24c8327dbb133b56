// Package gate pauses and resumes the process of a gated lease (`ortbus lease --gate`):
// Machine decides when (a pure state machine fed with gate states and clock ticks, which
// returns actions), and a Pauser carries the actions out (the cgroup v2 freezer, else
// SIGSTOP/SIGCONT of the process group: pauser.go).
package gate

import (
	"time"

	"github.com/ortbus/ortbus/codec"
)

// Action is what the machine asks of the pauser.
type Action int

// The actions.
const (
	None Action = iota
	Pause
	Resume
)

func (a Action) String() string { return [...]string{"none", "pause", "resume"}[a] }

// Why a pause ended (Machine.Why after a Resume).
const (
	WhyOpen     = "gate open"
	WhyExpired  = "gate expired"
	WhyLost     = "bus lost"
	WhyMaxPause = "max-pause"
	WhyMinShare = "min-share"
	WhyStop     = "stopping"
)

// Window is the span over which min-share holds.
const Window = time.Second

// epsilon: a pause is not begun with less than this left of its budget (no 0-length
// pauses), and a pause whose budget left is under it ends.
const epsilon = time.Millisecond

// Limits are a gated tenant's safety limits.
type Limits struct {
	// MaxPause bounds one pause (rule 2).
	MaxPause time.Duration
	// MinShare is the share of every Window of wall time the tenant keeps running
	// (rule 3), in [0, 1]; 1 never pauses.
	MinShare float64
}

// Machine decides when a gated tenant is paused. Its safety rules, each enforced where
// its number stands:
//
//  1. A pause needs a closed gate: the latest accepted gate state says closed and has not
//     expired (its ttl from its receipt, at most codec.MaxGateTTLMS). An open state or
//     the expiry resumes the tenant at once: a gateway that dies (kill -9) stops
//     refreshing its gate, so the tenant runs again within the ttl, and no pause starts
//     without a fresh closed state.
//  2. A pause never lasts longer than MaxPause, whatever the gate says.
//  3. Over any Window the tenant keeps at least MinShare of wall time (MinShare 0: no
//     such bound, max-pause alone holds): a pause ends when
//     the paused time within the last Window reaches (1 − MinShare) × Window, and one
//     begins only with a quarter of the longest pause allowed left below it, and only
//     once the tenant has run MinRun since the last resume (so a closed gate gives a
//     duty cycle, not a stutter of tiny pauses).
//  4. A lost bus (the wrapper's NATS connection down) resumes the tenant at once and
//     opens the gate: nothing heard is no reason to pause.
//  5. Stop (the wrapper's exit, or a signal it passes on) resumes the tenant and the
//     machine never pauses again.
//  6. A gate state older than the latest accepted one (its seq not above) is ignored,
//     unless the latest has expired: a forged state with a huge seq shuts real ones out
//     only for its own ttl, and its closed gate is bounded by rules 1 to 3 like any.
//
// Not safe for concurrent use: one goroutine feeds it.
type Machine struct {
	lim Limits

	closedUntil time.Time // the gate is closed until then (rule 1); zero: open
	seq         uint64    // the latest accepted state's seq
	seqUntil    time.Time // ... which holds until then (rule 6)
	lost        bool      // the bus is down (rule 4)
	stopped     bool      // rule 5

	paused    bool
	pausedAt  time.Time
	resumedAt time.Time
	past      []span // pauses ended within the last Window
	why       string // why the last pause ended
	pauses    int    // pauses begun
}

// span is one pause, [from, to).
type span struct{ from, to time.Time }

// New is a machine with lim; the tenant is running.
func New(lim Limits) *Machine {
	lim.MinShare = min(max(lim.MinShare, 0), 1)
	return &Machine{lim: lim}
}

// MinRun is how long the tenant runs after a resume before another pause may begin
// (rule 3): MaxPause × MinShare / (1 − MinShare), at most a Window.
func (m *Machine) MinRun() time.Duration {
	if m.lim.MinShare >= 1 {
		return Window
	}
	return min(Window, time.Duration(float64(m.lim.MaxPause)*m.lim.MinShare/(1-m.lim.MinShare)))
}

// minBegin is the least budget left with which a pause begins (rule 3): a quarter of
// the longest pause the limits allow, at least epsilon.
func (m *Machine) minBegin() time.Duration {
	return max(epsilon, min(m.lim.MaxPause, m.budget())/4)
}

// budget is the paused time a Window may hold (rule 3).
func (m *Machine) budget() time.Duration {
	return time.Duration(float64(Window) * (1 - m.lim.MinShare))
}

// pausedIn is the paused time within (now − Window, now], the current pause included.
func (m *Machine) pausedIn(now time.Time) time.Duration {
	from := now.Add(-Window)
	var sum time.Duration
	keep := m.past[:0]
	for _, s := range m.past {
		if !s.to.After(from) {
			continue
		}
		keep = append(keep, s)
		sum += s.to.Sub(later(s.from, from))
	}
	m.past = keep
	if m.paused {
		sum += now.Sub(later(m.pausedAt, from))
	}
	return sum
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// closed reports whether the gate is closed at now (rules 1, 4).
func (m *Machine) closed(now time.Time) bool {
	return !m.lost && now.Before(m.closedUntil)
}

// Gate feeds a gate state received at now: closed or open, holding for ttl, with seq.
func (m *Machine) Gate(now time.Time, closed bool, ttl time.Duration, seq uint64) Action {
	// Rule 6: an older state is ignored while the latest holds.
	if seq <= m.seq && now.Before(m.seqUntil) {
		return m.Tick(now)
	}
	ttl = min(max(ttl, 0), MaxTTL)
	m.seq, m.seqUntil = seq, now.Add(ttl)
	m.lost = false
	if closed {
		m.closedUntil = now.Add(ttl)
	} else {
		m.closedUntil = time.Time{}
	}
	return m.Tick(now)
}

// MaxTTL bounds the ttl of one gate state (rule 1): codec.MaxGateTTLMS.
const MaxTTL = codec.MaxGateTTLMS * time.Millisecond

// Lost says the bus is down (true) or back (false) at now (rule 4).
func (m *Machine) Lost(now time.Time, lost bool) Action {
	m.lost = lost
	if lost {
		m.closedUntil = time.Time{}
	}
	return m.Tick(now)
}

// Stop resumes the tenant for good (rule 5).
func (m *Machine) Stop(now time.Time) Action {
	m.stopped = true
	return m.Tick(now)
}

// Tick re-evaluates at now: whether a pause ends or begins.
func (m *Machine) Tick(now time.Time) Action {
	if m.paused {
		why := ""
		switch {
		case m.stopped: // rule 5
			why = WhyStop
		case m.lost: // rule 4
			why = WhyLost
		case m.closedUntil.IsZero(): // rule 1: an open state
			why = WhyOpen
		case !now.Before(m.closedUntil): // rule 1: expired
			why = WhyExpired
		case now.Sub(m.pausedAt) >= m.lim.MaxPause: // rule 2
			why = WhyMaxPause
		case m.lim.MinShare > 0 && m.budget()-m.pausedIn(now) < epsilon: // rule 3
			why = WhyMinShare
		}
		if why == "" {
			return None
		}
		m.past = append(m.past, span{m.pausedAt, now})
		m.paused, m.resumedAt, m.why = false, now, why
		return Resume
	}
	if m.stopped || !m.closed(now) || m.lim.MaxPause < epsilon || m.lim.MinShare >= 1 {
		return None
	}
	if m.pauses > 0 && now.Sub(m.resumedAt) < m.MinRun() { // rule 3: run MinRun first
		return None
	}
	if m.lim.MinShare > 0 && m.budget()-m.pausedIn(now) < m.minBegin() { // rule 3
		return None
	}
	m.paused, m.pausedAt, m.why = true, now, ""
	m.pauses++
	return Pause
}

// Next is when Tick must run next (zero: only on the next input): the end of a pause by
// rules 1 to 3, or when a pause may begin under a closed gate.
func (m *Machine) Next(now time.Time) time.Time {
	if m.stopped {
		return time.Time{}
	}
	if m.paused {
		at := m.pausedAt.Add(m.lim.MaxPause) // rule 2
		if !m.closedUntil.IsZero() && m.closedUntil.Before(at) {
			at = m.closedUntil // rule 1
		}
		// Rule 3: the paused time in the window grows at most as fast as the clock, so
		// it cannot reach the budget before now + what is left of it.
		if left := m.budget() - m.pausedIn(now); m.lim.MinShare > 0 && now.Add(left).Before(at) {
			at = now.Add(max(left, 0))
		}
		return at
	}
	if !m.closed(now) || m.lim.MaxPause < epsilon || m.lim.MinShare >= 1 {
		return time.Time{}
	}
	at := now
	if m.pauses > 0 {
		at = later(at, m.resumedAt.Add(m.MinRun()))
	}
	if left := m.budget() - m.pausedIn(now); m.lim.MinShare > 0 && left < m.minBegin() {
		at = later(at, now.Add(m.untilFreed(now, m.minBegin()-left)))
	}
	if !at.Before(m.closedUntil) {
		return m.closedUntil // it expires first: nothing to begin
	}
	return at
}

// untilFreed is how long after now (not paused) the paused time within the window has
// dropped by need, as the window's start passes over the pauses in it.
func (m *Machine) untilFreed(now time.Time, need time.Duration) time.Duration {
	w := now.Add(-Window)
	for _, s := range m.past { // in time order
		from := later(s.from, w)
		if !s.to.After(from) {
			continue
		}
		if d := s.to.Sub(from); d >= need {
			return from.Add(need).Sub(w)
		} else {
			need -= d
		}
	}
	return Window // nothing left in the window to free: cannot happen while left < budget
}

// Paused reports whether the tenant is paused.
func (m *Machine) Paused() bool { return m.paused }

// Why is why the last pause ended.
func (m *Machine) Why() string { return m.why }

// Pauses counts the pauses begun.
func (m *Machine) Pauses() int { return m.pauses }
