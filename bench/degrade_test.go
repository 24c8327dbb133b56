package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/config"
)

// TestDegradePlan: [degrade]'s defaults and the plans it refuses.
func TestDegradePlan(t *testing.T) {
	sc, err := LoadScenario("gpu-short")
	if err != nil {
		t.Fatal(err)
	}
	d := sc.Degrade
	if d.Class != "urgent" || d.killAt(4*time.Second) != time.Second || d.killAt(900*time.Millisecond) != 300*time.Millisecond {
		t.Fatalf("plan %+v, kill at %v", d, d.killAt(4*time.Second))
	}
	if c := sc.degradeChain(); len(c) != 2 || c[0] != "rt" || c[1] != "rtcpu" {
		t.Fatalf("chain %v", c)
	}
	for _, bad := range []DegradePlan{
		{Class: "interactive"}, // a chain of one pool: nowhere to move to
		{Class: "nobody"},
		{Classes: []string{"batch"}},
		{Classes: []string{"urgent", "ghosts"}},
		{KillAt: -1},
	} {
		if err := sc.checkDegrade(&bad); err == nil {
			t.Errorf("plan %+v accepted", bad)
		}
	}
	noTenant := *sc
	noTenant.Tenant = nil
	if err := noTenant.checkDegrade(&DegradePlan{Tenant: true}); err == nil || !strings.Contains(err.Error(), "[tenant]") {
		t.Errorf("tenant = true without a tenant: %v", err)
	}
}

// TestDegradeTally: the phases are cut at the kill and at the first result the killed
// pool serves again, each with its results by pool; the counts are over every class,
// a frame the client skipped is not sent, an unanswered request is lost.
func TestDegradeTally(t *testing.T) {
	sc := &Scenario{Window: config.Duration(4 * time.Second)}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	mk := func(class string, sent int, pool, code string) call {
		return call{Class: class, Sent: at(sent), Recv: at(sent + 5), Done: true, Pool: pool, Code: code, Deadline: 100 * time.Millisecond}
	}
	calls := []call{
		mk("urgent", 0, "rt", ""), mk("urgent", 500, "rt", ""),
		mk("urgent", 1000, "rtcpu", ""), mk("urgent", 1500, "rtcpu", ""), mk("urgent", 1800, "", "deadline_exceeded"), mk("urgent", 1900, "", codeSkipped),
		mk("urgent", 2000, "rt", ""), mk("urgent", 3990, "rtcpu", ""),
		mk("interactive", 700, "ui", ""),
	}
	lost := mk("interactive", 1200, "", "")
	lost.Done = false
	calls = append(calls, lost)
	kill := &degradeKill{killedAt: at(1000), liveAt: at(1800)}
	d := &DegradeRun{Class: "urgent", Pool: "rt", Outcomes: map[string]int{}}
	d.tally(sc, calls, &CollisionRun{}, kill, t0)
	if d.KillAtMS != 1000 || d.ReplacementLiveMS != 800 || d.BackMS != 1000 {
		t.Fatalf("kill at %v, live after %v, back after %v", d.KillAtMS, d.ReplacementLiveMS, d.BackMS)
	}
	if d.Sent != 9 || d.Answered != 8 || d.Lost != 1 || d.Outcomes["ok"] != 7 || d.Outcomes["deadline_exceeded"] != 1 {
		t.Fatalf("sent %d answered %d lost %d outcomes %v", d.Sent, d.Answered, d.Lost, d.Outcomes)
	}
	want := []struct {
		phase         string
		from, to      float64
		count, ok     int
		missed        int
		rt, rtcpu, p0 int
	}{{"before", 0, 1000, 2, 2, 0, 2, 0, 0}, {"across", 1000, 2000, 4, 2, 2, 0, 2, 0}, {"after", 2000, 4000, 2, 2, 0, 1, 1, 0}}
	for i, w := range want {
		p := d.Phases[i]
		if p.Phase != w.phase || p.FromMS != w.from || p.ToMS != w.to || p.Count != w.count || p.OK != w.ok || p.Missed != w.missed ||
			p.ByPool["rt"] != w.rt || p.ByPool["rtcpu"] != w.rtcpu || p.P95MS <= 0 {
			t.Errorf("phase %d: %+v, want %+v", i, p, w)
		}
	}
	// The pool never serving again: no after phase.
	d = &DegradeRun{Class: "urgent", Pool: "rt", Outcomes: map[string]int{}}
	d.tally(sc, calls[:6], &CollisionRun{}, &degradeKill{killedAt: at(1000)}, t0)
	if d.BackMS != -1 || d.ReplacementLiveMS != -1 || d.Phases[1].ToMS != 4000 || d.Phases[2].Count != 0 {
		t.Fatalf("never back: back %v, live %v, phases %+v %+v", d.BackMS, d.ReplacementLiveMS, d.Phases[1], d.Phases[2])
	}
	var out strings.Builder
	rep := newReport("collision")
	d.Lost = 1
	d.print(&out, rep)
	if !strings.Contains(out.String(), "1 lost (target 0: MISSED)") || !strings.Contains(out.String(), "none within the run") || len(rep.Notes) != 1 {
		t.Fatalf("print:\n%s\nnotes %v", out.String(), rep.Notes)
	}
}
