package gate

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// sim drives a machine on a fake clock: inputs at given times, and Tick whenever the
// machine asks (Next) in between, recording the pauses.
type sim struct {
	t      *testing.T
	m      *Machine
	now    time.Time
	spans  []span // pauses ended
	open   bool   // a pause is open
	from   time.Time
	whys   []string
	checks int
}

func newSim(t *testing.T, lim Limits) *sim {
	return &sim{t: t, m: New(lim), now: time.Unix(1000, 0)}
}

func (s *sim) apply(a Action) {
	switch a {
	case Pause:
		if s.open {
			s.t.Fatalf("%v: pause while paused", s.now)
		}
		s.open, s.from = true, s.now
	case Resume:
		if !s.open {
			s.t.Fatalf("%v: resume while running", s.now)
		}
		s.open = false
		s.spans = append(s.spans, span{s.from, s.now})
		s.whys = append(s.whys, s.m.Why())
	}
	if s.open != s.m.Paused() {
		s.t.Fatalf("%v: machine paused=%v, actions say %v", s.now, s.m.Paused(), s.open)
	}
}

// advance runs the clock to at, ticking whenever the machine asks.
var testHook = func() {}

func (s *sim) advance(at time.Time) {
	testHook()
	for {
		next := s.m.Next(s.now)
		if next.IsZero() || next.After(at) {
			break
		}
		if next.Before(s.now) {
			s.t.Fatalf("%v: Next %v is in the past", s.now, next)
		}
		if next.Equal(s.now) {
			// Due now: one Tick must act, else the driver would spin.
			if a := s.m.Tick(s.now); a == None {
				s.t.Fatalf("%v: Next says now, Tick does nothing", s.now)
			} else {
				s.apply(a)
			}
			continue
		}
		s.now = next
		testHook()
		s.apply(s.m.Tick(s.now))
	}
	s.now = at
	s.apply(s.m.Tick(s.now))
}

func (s *sim) gate(closed bool, ttl time.Duration, seq uint64) {
	s.apply(s.m.Gate(s.now, closed, ttl, seq))
}

// all is every pause, the open one ending now.
func (s *sim) all() []span {
	out := append([]span(nil), s.spans...)
	if s.open {
		out = append(out, span{s.from, s.now})
	}
	return out
}

// checkLimits: no pause longer than MaxPause; in every window of Window, at most
// (1 − MinShare) × Window paused (checked at every pause's end and start, where the
// maximum of the sliding sum is reached).
func (s *sim) checkLimits(lim Limits) {
	s.t.Helper()
	spans := s.all()
	budget := time.Duration(float64(Window) * (1 - lim.MinShare))
	for _, sp := range spans {
		if d := sp.to.Sub(sp.from); d > lim.MaxPause {
			s.t.Fatalf("a pause of %v, over max-pause %v", d, lim.MaxPause)
		}
		for _, end := range []time.Time{sp.to, sp.from.Add(Window)} {
			var sum time.Duration
			w := end.Add(-Window)
			first := sort.Search(len(spans), func(j int) bool { return spans[j].to.After(w) })
			for _, o := range spans[first:] {
				if !o.from.Before(end) {
					break
				}
				a, b := later(o.from, w), o.to
				if b.After(end) {
					b = end
				}
				if b.After(a) {
					sum += b.Sub(a)
				}
			}
			s.checks++
			if sum > budget+time.Microsecond {
				s.t.Fatalf("%v paused in the window ending %v, over %v (min-share %v)", sum, end, budget, lim.MinShare)
			}
		}
	}
}

// TestClosedGateDutyCycle: a gate held closed (refreshed every 100 ms) gives pauses of
// max-pause and runs of MinRun: 250 ms each at max-pause 250 ms, min-share 0.5.
func TestClosedGateDutyCycle(t *testing.T) {
	lim := Limits{MaxPause: 250 * time.Millisecond, MinShare: 0.5}
	s := newSim(t, lim)
	for i := range 50 {
		s.gate(true, 300*time.Millisecond, uint64(i+1))
		s.advance(s.now.Add(100 * time.Millisecond))
	}
	s.checkLimits(lim)
	if len(s.spans) < 8 {
		t.Fatalf("%d pauses in 5 s of closed gate", len(s.spans))
	}
	var paused time.Duration
	for _, sp := range s.spans {
		paused += sp.to.Sub(sp.from)
	}
	if share := float64(paused) / float64(5*time.Second); share < 0.4 || share > 0.5 {
		t.Errorf("paused %.2f of the time under a closed gate, want about 0.5", share)
	}
	for _, w := range s.whys {
		if w != WhyMaxPause && w != WhyMinShare {
			t.Errorf("a pause under a closed gate ended by %q", w)
		}
	}
}

// TestOpenResumesAtOnce: an open state resumes at once; a pause begins at once on a
// closed one.
func TestOpenResumesAtOnce(t *testing.T) {
	s := newSim(t, Limits{MaxPause: 10 * time.Second, MinShare: 0.01})
	s.gate(true, time.Second, 1)
	if !s.m.Paused() {
		t.Fatal("not paused on a closed gate")
	}
	s.advance(s.now.Add(50 * time.Millisecond))
	s.gate(false, time.Second, 2)
	if s.m.Paused() || s.m.Why() != WhyOpen {
		t.Fatalf("paused %v (why %q) after the gate opened", s.m.Paused(), s.m.Why())
	}
}

// TestExpiryResumesAndStaysRunning: the gateway goes silent (kill -9) mid-pause: the
// tenant resumes at the state's expiry, before a long max-pause, and no pause begins
// again without a new state.
func TestExpiryResumesAndStaysRunning(t *testing.T) {
	s := newSim(t, Limits{MaxPause: 30 * time.Second, MinShare: 0.01})
	s.gate(true, 300*time.Millisecond, 1)
	s.advance(s.now.Add(100 * time.Millisecond))
	s.gate(true, 300*time.Millisecond, 2) // the last one
	start := s.now
	s.advance(s.now.Add(time.Minute))
	if len(s.spans) != 1 || s.spans[0].to != start.Add(300*time.Millisecond) || s.whys[0] != WhyExpired {
		t.Fatalf("pauses %v (%v), want one ending at the expiry", s.spans, s.whys)
	}
	if s.m.Paused() {
		t.Fatal("paused again without a gate state")
	}
}

// TestLostResumes: the bus lost resumes at once and opens the gate.
func TestLostResumes(t *testing.T) {
	s := newSim(t, Limits{MaxPause: 30 * time.Second, MinShare: 0.01})
	s.gate(true, 2*time.Second, 1)
	s.advance(s.now.Add(10 * time.Millisecond))
	s.apply(s.m.Lost(s.now, true))
	if s.m.Paused() || s.m.Why() != WhyLost {
		t.Fatalf("paused %v (why %q) after the bus was lost", s.m.Paused(), s.m.Why())
	}
	s.advance(s.now.Add(5 * time.Second))
	if s.m.Paused() {
		t.Fatal("paused while the bus is lost")
	}
}

// TestStopResumesForGood: Stop resumes, and no later closed state pauses.
func TestStopResumesForGood(t *testing.T) {
	s := newSim(t, Limits{MaxPause: time.Second, MinShare: 0.1})
	s.gate(true, time.Second, 1)
	s.apply(s.m.Stop(s.now))
	if s.m.Paused() || s.m.Why() != WhyStop {
		t.Fatalf("paused %v after Stop", s.m.Paused())
	}
	s.gate(true, time.Second, 2)
	s.advance(s.now.Add(3 * time.Second))
	if s.m.Paused() || len(s.spans) != 1 {
		t.Fatalf("paused after Stop: %v", s.spans)
	}
}

// TestForgedSeq: a state with a huge seq shuts the real ones out only for its ttl, and
// its closed gate pauses at most max-pause; then the real states count again.
func TestForgedSeq(t *testing.T) {
	lim := Limits{MaxPause: 250 * time.Millisecond, MinShare: 0.5}
	s := newSim(t, lim)
	s.gate(true, 2*time.Second, ^uint64(0)) // forged: closed, long, the top seq
	s.gate(false, 300*time.Millisecond, 5)  // a real open state: ignored while the forged holds
	s.advance(s.now.Add(3 * time.Second))
	s.checkLimits(lim)
	if s.m.Paused() {
		t.Fatal("paused past the forged state's ttl")
	}
	s.gate(true, 300*time.Millisecond, 6) // the forged one expired: a real state counts
	if !s.m.Paused() {
		t.Fatal("a real closed state after the forged one's expiry is ignored")
	}
	s.gate(false, 300*time.Millisecond, 7)
	if s.m.Paused() {
		t.Fatal("a real open state is ignored")
	}
}

// TestMinShareOne never pauses; max-pause 0 never pauses.
func TestNeverPauses(t *testing.T) {
	for _, lim := range []Limits{{MaxPause: time.Second, MinShare: 1}, {MaxPause: 0, MinShare: 0.5}} {
		s := newSim(t, lim)
		s.gate(true, time.Second, 1)
		s.advance(s.now.Add(3 * time.Second))
		if len(s.all()) != 0 {
			t.Errorf("%+v: paused %v", lim, s.all())
		}
	}
}

// TestRandomLimitsHold: random gate states (open, closed, ttls, seqs out of order,
// silences, bus losses) under random limits never break rules 2 and 3.
func TestRandomLimitsHold(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	total := 0
	for run := range 25 {
		lim := Limits{MaxPause: time.Duration(1+r.IntN(600)) * time.Millisecond, MinShare: r.Float64()}
		if run%5 == 0 {
			lim.MinShare = 0
		}
		s := newSim(t, lim)
		var seq uint64
		for range 200 {
			switch k := r.IntN(10); {
			case k < 6:
				seq += uint64(r.IntN(3)) // sometimes a repeat
				if r.IntN(10) == 0 {
					seq -= min(seq, 2) // sometimes an older one
				}
				s.gate(r.IntN(3) > 0, time.Duration(r.IntN(2500))*time.Millisecond, seq)
			case k < 7:
				s.apply(s.m.Lost(s.now, r.IntN(2) == 0))
			}
			s.advance(s.now.Add(time.Duration(r.IntN(400)) * time.Millisecond))
		}
		s.checkLimits(lim)
		total += len(s.all())
	}
	if total < 100 {
		t.Errorf("only %d pauses in all the runs: the test does not exercise pausing", total)
	}
}

// TestMinShareZero: with min-share 0 only max-pause ends a pause under a closed gate.
func TestMinShareZero(t *testing.T) {
	lim := Limits{MaxPause: 5 * time.Second, MinShare: 0}
	s := newSim(t, lim)
	for i := range 40 {
		s.gate(true, 300*time.Millisecond, uint64(i+1))
		s.advance(s.now.Add(100 * time.Millisecond))
	}
	if len(s.spans) != 0 || !s.m.Paused() {
		t.Fatalf("pauses %v under a closed gate for 4 s with max-pause 5 s", s.spans)
	}
	s.gate(true, 300*time.Millisecond, 100)
	s.advance(s.now.Add(time.Second))
	if len(s.spans) != 1 || s.whys[0] != WhyExpired {
		t.Fatalf("pauses %v %v", s.spans, s.whys)
	}
}
