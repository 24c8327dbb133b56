package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/sched"
)

// The lifecycle's transitions (lifecycle.go's table), events in and effects out: no
// NATS, no goroutine, a clock of the test's own.

// fakeEnv answers the lifecycle's questions from fields.
type fakeEnv struct {
	direct bool            // every attempt is reply_direct
	live   map[string]bool // pools with a live worker
	coming bool            // local workers on their way (mayRun without a live pool)
}

func (e *fakeEnv) device(pool string) string                { return "dev-" + pool }
func (e *fakeEnv) replyDirect(p *pending, pool string) bool { return e.direct }
func (e *fakeEnv) retryPools(p *pending) []string           { return []string{"gpu", "cpu"} }
func (e *fakeEnv) hasLive(pool string) bool                 { return e.live[pool] }
func (e *fakeEnv) mayRun(pools []string) bool {
	for _, p := range pools {
		if e.live[p] {
			return true
		}
	}
	return e.coming
}

// t0 is the tests' clock's start.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// testClaimTimeout is the tests' claim timeout.
const testClaimTimeout = 100 * time.Millisecond

func newTestLifecycle() *lifecycle {
	q := sched.New([]sched.Class{{Name: "urgent", Priority: 0, Bound: 8}, {Name: "interactive", Priority: 1, Bound: 2, Shed: "reject"}, {Name: "batch", Priority: 2, Bound: 2, Shed: "drop_oldest"}})
	return newLifecycle(&fakeEnv{live: map[string]bool{"gpu": true}}, q, testClaimTimeout, 0)
}

func envOf(lc *lifecycle) *fakeEnv { return lc.env.(*fakeEnv) }

// req is a request of class id, due a minute after t0, owned by an inbox.
func req(id, class string) *pending {
	return &pending{id: id, op: "tag", class: class, owner: "_INBOX.c", accepted: t0, deadline: t0.Add(time.Minute), req: codec.Request{ID: id}}
}

// to routes every item to pool, to worker ("" for the queue group).
func to(pool, worker string) decide {
	return func(*sched.Item, map[string]bool) decision { return decision{pool: pool, worker: worker} }
}

// waits routes nothing.
func waits(*sched.Item, map[string]bool) decision { return decision{} }

// answerOf is the error of the one answer among effects (nil for none or a result).
func answerOf(effects []effect) *codec.Error {
	for _, e := range effects {
		if a, ok := e.(effAnswer); ok {
			return a.err
		}
	}
	return nil
}

// terminals counts the terminal effects of effects, per request id.
func terminals(effects []effect) map[string]int {
	n := map[string]int{}
	for _, e := range effects {
		switch e := e.(type) {
		case effAnswer:
			n[e.p.id]++
		case effRelay:
			n[e.p.id]++
		case effSettled:
			n[e.p.id]++
		}
	}
	return n
}

// only returns the one effect of type E in effects, failing the test otherwise.
func only[E effect](t *testing.T, effects []effect) E {
	t.Helper()
	var found []E
	for _, e := range effects {
		if x, ok := e.(E); ok {
			found = append(found, x)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %T among %d effects %+v, got %d", *new(E), len(effects), effects, len(found))
	}
	return found[0]
}

// wantCode checks that effects answer id with code, once and alone.
func wantCode(t *testing.T, effects []effect, id string, code codec.Code) {
	t.Helper()
	a := only[effAnswer](t, effects)
	if a.p.id != id || a.err == nil || a.err.Code != code {
		t.Fatalf("answer %s %v, want %s %s", a.p.id, a.err, id, code)
	}
}

// sent accepts p and runs a pass at now that routes it with route, returning its send.
func sent(t *testing.T, lc *lifecycle, p *pending, route decide, now time.Time) effSend {
	t.Helper()
	if e := answerOf(lc.accept(p, []string{"gpu"}, now)); e != nil {
		t.Fatalf("accept %s: %v", p.id, e)
	}
	return only[effSend](t, lc.pass(now, route))
}

// state is id's state ("answered" when forgotten).
func state(lc *lifecycle, id string) string {
	if f := lc.byID[id]; f != nil {
		return f.state.String()
	}
	return "answered"
}

// empty checks that nothing is held, queued or timed any more.
func empty(t *testing.T, lc *lifecycle) {
	t.Helper()
	for pool, n := range lc.busy {
		if n != 0 {
			t.Errorf("pool %s: %d held", pool, n)
		}
	}
	if len(lc.byID) != 0 || len(lc.bySeq) != 0 || len(lc.timers) != 0 || len(lc.load) != 0 || len(lc.workers) != 0 || len(lc.perAccount) != 0 {
		t.Errorf("left: %d flights, %d reply tokens, %d timers, load %v, workers %v, accounts %v", len(lc.byID), len(lc.bySeq), len(lc.timers), lc.load, lc.workers, lc.perAccount)
	}
	for _, c := range []string{"urgent", "interactive", "batch"} {
		if n := lc.queues.Len(c); n != 0 {
			t.Errorf("%d left in queue %s", n, c)
		}
	}
}

// L1: an accepted request is queued and recorded; its cancel that came first, its id in
// flight already, a full queue answer it instead; drop_oldest answers the dropped one.
func TestLifecycleAccept(t *testing.T) {
	lc := newTestLifecycle()
	out := lc.accept(req("a", "interactive"), []string{"gpu"}, t0)
	if r := only[effRecord](t, out); r.p.id != "a" || state(lc, "a") != "queued" || lc.queues.Len("interactive") != 1 {
		t.Fatalf("accepted: %+v, state %s", out, state(lc, "a"))
	}
	wantCode(t, lc.accept(req("a", "interactive"), []string{"gpu"}, t0), "a", codec.CodeBadRequest)
	lc.accept(req("b", "interactive"), []string{"gpu"}, t0)
	wantCode(t, lc.accept(req("c", "interactive"), []string{"gpu"}, t0), "c", codec.CodeOverloaded) // reject

	lc.accept(req("b1", "batch"), []string{"gpu"}, t0)
	lc.accept(req("b2", "batch"), []string{"gpu"}, t0)
	out = lc.accept(req("b3", "batch"), []string{"gpu"}, t0) // drop_oldest: b1 goes
	wantCode(t, out, "b1", codec.CodeOverloaded)
	if state(lc, "b1") != "answered" || state(lc, "b3") != "queued" {
		t.Fatalf("after drop_oldest: b1 %s, b3 %s", state(lc, "b1"), state(lc, "b3"))
	}

	// A cancel of an unknown id by its owner, then the request: answered cancelled.
	if found, out := lc.cancel("late", "_INBOX.c.9", "", false, t0); found || len(out) != 0 {
		t.Fatalf("cancel of an unknown id: %v %+v", found, out)
	}
	wantCode(t, lc.accept(req("late", "urgent"), []string{"gpu"}, t0), "late", codec.CodeCancelled)
	// Not by someone else's cancel.
	lc.cancel("other", "_INBOX.d.1", "", false, t0)
	if e := answerOf(lc.accept(req("other", "urgent"), []string{"gpu"}, t0)); e != nil {
		t.Fatalf("another owner's early cancel cancelled it: %v", e)
	}
}

// L1 with a cache hit: the hit is the request's one answer, never queued; a cancel its
// client sent before it (or while it was looked up) wins over the hit, once.
func TestLifecycleAcceptHit(t *testing.T) {
	lc := newTestLifecycle()
	hit := func(id string) *pending {
		p := req(id, "interactive")
		p.hit = []byte("cached")
		return p
	}
	out := lc.accept(hit("h"), nil, t0)
	if a := only[effAnswer](t, out); a.err != nil || string(a.body) != "cached" || len(out) != 1 {
		t.Fatalf("a hit: %+v, want its one answer the cached body", out)
	}
	lc.cancel("hc", "_INBOX.c.9", "", false, t0)
	out = lc.accept(hit("hc"), nil, t0)
	wantCode(t, out, "hc", codec.CodeCancelled)
	if n := terminals(out)["hc"]; n != 1 {
		t.Fatalf("a cancelled hit: %d terminal effects, want 1", n)
	}
	// Another owner's cancel does not take the hit away.
	lc.cancel("ho", "_INBOX.d.1", "", false, t0)
	if a := only[effAnswer](t, lc.accept(hit("ho"), nil, t0)); a.err != nil || string(a.body) != "cached" {
		t.Fatalf("a hit cancelled early by another owner: %+v", a)
	}
	empty(t, lc)
}

// A request accepted after the loop stopped (a cache hit, a lookup that ended after the
// shutdown) still gets its one answer: no_worker, as the queued ones at the shutdown.
func TestAcceptAfterLoopStopped(t *testing.T) {
	g := loopGateway(parseConfig(t, routeConfig))
	g.d.start(false)() // started and stopped
	var got []*codec.Error
	p := req("late", "interactive")
	p.hit = []byte("cached")
	p.reply = func(_ []byte, e *codec.Error) { got = append(got, e) }
	g.d.post(evAccept{p: p})
	if len(got) != 1 || got[0] == nil || got[0].Code != codec.CodeNoWorker {
		t.Fatalf("answers after the loop stopped: %v, want one no_worker", got)
	}
}

// L2 and L4 relayed: a pass sends the attempt with a reply token and its timers; the
// reply to that token relays the answer and gives back the unit; a second reply, or one
// to an unknown token, does nothing.
func TestLifecycleSendRelayed(t *testing.T) {
	lc := newTestLifecycle()
	s := sent(t, lc, req("a", "interactive"), to("gpu", ""), t0)
	if s.attempt != 1 || s.direct || s.seq == 0 || s.pool != "gpu" || state(lc, "a") != "sent" {
		t.Fatalf("send %+v, state %s", s, state(lc, "a"))
	}
	if lc.busy["gpu"] != 1 || lc.load["dev-gpu"]["interactive"] != 1 || len(lc.timers) != 2 {
		t.Fatalf("held: busy %v load %v timers %d", lc.busy, lc.load, len(lc.timers))
	}
	msg := &nats.Msg{Data: []byte("result")}
	r := only[effRelay](t, lc.reply(s.seq, msg, t0.Add(time.Millisecond)))
	if r.p.id != "a" || r.pool != "gpu" || r.msg != msg {
		t.Fatalf("relay %+v", r)
	}
	if out := lc.reply(s.seq, msg, t0); len(out) != 0 {
		t.Fatalf("a second reply: %+v", out)
	}
	if out := lc.reply(999, msg, t0); len(out) != 0 {
		t.Fatalf("a reply to an unknown token: %+v", out)
	}
	empty(t, lc)
}

// L3 and L4 direct: "taken" records the claiming worker; "done" from the worker it was
// sent to settles it. A claim of another attempt or pool, or a done from another worker,
// changes nothing.
func TestLifecycleDirectDone(t *testing.T) {
	lc := newTestLifecycle()
	envOf(lc).direct = true
	s := sent(t, lc, req("a", "interactive"), to("gpu", "w1"), t0)
	if !s.direct || s.seq != 0 || s.target != "w1" || lc.workers["w1"]["interactive"] != 1 {
		t.Fatalf("direct send %+v, workers %v", s, lc.workers)
	}
	for _, c := range []codec.Claim{
		{ID: "a", Attempt: 2, Pool: "gpu", Worker: "w1", State: codec.ClaimDone},
		{ID: "a", Attempt: 1, Pool: "cpu", Worker: "w1", State: codec.ClaimDone},
		{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w2", State: codec.ClaimDone},
		{ID: "b", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimDone},
	} {
		if out := lc.claim(c, "", t0); len(out) != 0 || state(lc, "a") != "sent" {
			t.Fatalf("claim %+v: %+v, state %s", c, out, state(lc, "a"))
		}
	}
	lc.claim(codec.Claim{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0)
	if f := lc.byID["a"]; f.state != stClaimed || f.worker != "w1" {
		t.Fatalf("after taken: %s by %q", f.state, f.worker)
	}
	st := only[effSettled](t, lc.claim(codec.Claim{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimDone, Code: codec.CodeCancelled}, "", t0))
	if st.p.id != "a" || st.pool != "gpu" || st.claim.Code != codec.CodeCancelled {
		t.Fatalf("settled %+v", st)
	}
	if !lc.freed {
		t.Fatal("the unit given back is not flagged for a pass")
	}
	empty(t, lc)

	// Sent to the queue group: the first worker's done settles it.
	s = sent(t, lc, req("q", "interactive"), to("gpu", ""), t0)
	only[effSettled](t, lc.claim(codec.Claim{ID: "q", Attempt: s.attempt, Pool: "gpu", Worker: "any", State: codec.ClaimDone}, "", t0))
	empty(t, lc)
}

// L7: the death of the claiming worker retries the request once at the front of its
// queue; the second holder's death answers poison_input. A late claim or done of the
// dead worker's attempt (a draining beat's, after its exit) reaches nothing.
func TestLifecycleWorkerDied(t *testing.T) {
	lc := newTestLifecycle()
	envOf(lc).direct = true
	lc.accept(req("older", "interactive"), []string{"gpu"}, t0)
	lc.accept(req("a", "interactive"), []string{"gpu"}, t0)
	if out := lc.pass(t0, to("gpu", "")); len(out) != 2 {
		t.Fatalf("the pass: %+v, want two sends", out)
	}
	lc.claim(codec.Claim{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0)
	lc.claim(codec.Claim{ID: "older", Attempt: 1, Pool: "gpu", Worker: "w2", State: codec.ClaimTaken}, "", t0)
	out := lc.died("gpu", "w1", "exit 2", 1, t0.Add(time.Second))
	only[effRetried](t, out)
	if len(terminals(out)) != 0 || state(lc, "a") != "queued" || state(lc, "older") != "claimed" || lc.busy["gpu"] != 1 {
		t.Fatalf("after w1's death: %+v; a %s, older %s, busy %d", out, state(lc, "a"), state(lc, "older"), lc.busy["gpu"])
	}
	// Late words of w1 about attempt 1: nothing.
	for _, st := range []string{codec.ClaimTaken, codec.ClaimDone} {
		if out := lc.claim(codec.Claim{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w1", State: st}, "", t0); len(out) != 0 || state(lc, "a") != "queued" {
			t.Fatalf("late %s claim of the dead worker: %+v, state %s", st, out, state(lc, "a"))
		}
	}
	s2 := only[effSend](t, lc.pass(t0.Add(time.Second), to("gpu", "w3")))
	if s2.p.id != "a" || s2.attempt != 2 {
		t.Fatalf("retry %+v", s2)
	}
	if out := lc.claim(codec.Claim{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimDone}, "", t0); len(out) != 0 {
		t.Fatalf("the dead worker's done settled the retry: %+v", out)
	}
	lc.claim(codec.Claim{ID: "a", Attempt: 2, Pool: "gpu", Worker: "w3", State: codec.ClaimTaken}, "", t0)
	wantCode(t, lc.died("gpu", "w3", "exit 2", 1, t0.Add(2*time.Second)), "a", codec.CodePoisonInput)

	// No retry when no pool can run it: worker_lost.
	envOf(lc).live = map[string]bool{}
	wantCode(t, lc.died("gpu", "w2", "exit 1", 0, t0.Add(3*time.Second)), "older", codec.CodeWorkerLost)
	empty(t, lc)
}

// L7 for unclaimed attempts: one sent to the dead worker alone is its; one sent to the
// pool's queue group is its only when the pool has no other live worker.
func TestLifecycleDiedUnclaimed(t *testing.T) {
	lc := newTestLifecycle()
	sent(t, lc, req("alone", "interactive"), to("gpu", "w1"), t0)
	sent(t, lc, req("group", "interactive"), to("gpu", ""), t0)
	out := lc.died("gpu", "w1", "exit 2", 1, t0)
	if state(lc, "alone") != "queued" || state(lc, "group") != "sent" || len(terminals(out)) != 0 {
		t.Fatalf("w1 died, another lives: alone %s, group %s", state(lc, "alone"), state(lc, "group"))
	}
	lc.died("gpu", "w2", "exit 2", 0, t0)
	if state(lc, "group") != "queued" {
		t.Fatalf("the pool's last worker died: group %s, want queued again", state(lc, "group"))
	}
}

// L6: no claim within the claim timeout: queued again at the front (no death); when a
// worker of the pool died since the send, as that worker's death (L7); past the deadline,
// deadline_exceeded.
func TestLifecycleUnclaimed(t *testing.T) {
	lc := newTestLifecycle()
	sent(t, lc, req("a", "interactive"), to("gpu", ""), t0)
	if out := lc.tick(t0.Add(testClaimTimeout - time.Millisecond)); len(out) != 0 {
		t.Fatalf("before the claim timeout: %+v", out)
	}
	out := lc.tick(t0.Add(testClaimTimeout))
	if u := only[effUnclaimed](t, out); u.p.id != "a" || state(lc, "a") != "queued" || lc.byID["a"].deaths != 0 {
		t.Fatalf("unclaimed: %+v, state %s", out, state(lc, "a"))
	}
	// Sent again; a worker of the pool dies after the send, before any claim.
	now := t0.Add(time.Second)
	only[effSend](t, lc.pass(now, to("gpu", "")))
	lc.lastDeath["gpu"] = death{worker: "w9", why: "exit 2", at: now.Add(time.Millisecond)}
	out = lc.tick(now.Add(testClaimTimeout))
	only[effRetried](t, out)
	if lc.byID["a"].deaths != 1 {
		t.Fatalf("deaths %d, want 1 (taken as the dead worker's)", lc.byID["a"].deaths)
	}
	// Another, with its deadline gone by the claim timeout.
	lc = newTestLifecycle()
	p := req("late", "interactive")
	p.deadline = t0.Add(50 * time.Millisecond)
	sent(t, lc, p, to("gpu", ""), t0)
	wantCode(t, lc.tick(t0.Add(testClaimTimeout)), "late", codec.CodeDeadlineExceeded)
}

// L3a: a taken claim with a reply subject gets its verdict. Own only for the first
// worker to claim the current attempt, where the attempt could have reached it: a claim
// that comes after L6 sent the request again (the attempt is over) is not Own, so the
// late worker of a reply_direct item never answers beside the new attempt's.
func TestLifecycleVerdict(t *testing.T) {
	lc := newTestLifecycle()
	envOf(lc).direct = true
	verdict := func(c codec.Claim) codec.ClaimVerdict {
		t.Helper()
		v := only[effVerdict](t, lc.claim(c, "ortbus.worker."+c.Worker+".verdict", t0))
		if v.to != "ortbus.worker."+c.Worker+".verdict" || v.v.ID != c.ID || v.v.Attempt != c.Attempt {
			t.Fatalf("verdict %+v for claim %+v", v, c)
		}
		return v.v
	}
	sent(t, lc, req("a", "interactive"), to("gpu", ""), t0)
	only[effUnclaimed](t, lc.tick(t0.Add(testClaimTimeout))) // w1's claim is late
	s2 := only[effSend](t, lc.pass(t0.Add(testClaimTimeout), to("gpu", "")))
	if s2.attempt != 2 || !s2.direct {
		t.Fatalf("sent again: %+v", s2)
	}
	if v := verdict(codec.Claim{ID: "a", Attempt: 2, Pool: "gpu", Worker: "w2", State: codec.ClaimTaken}); !v.Own {
		t.Fatalf("the current attempt's first claim: %+v, want own", v)
	}
	if v := verdict(codec.Claim{ID: "a", Attempt: 2, Pool: "gpu", Worker: "w2", State: codec.ClaimTaken}); !v.Own {
		t.Fatalf("the holder's claim again: %+v, want own", v)
	}
	for _, c := range []codec.Claim{
		{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, // late: after L6
		{ID: "a", Attempt: 2, Pool: "gpu", Worker: "w3", State: codec.ClaimTaken}, // another's
		{ID: "a", Attempt: 2, Pool: "cpu", Worker: "w2", State: codec.ClaimTaken}, // another pool
		{ID: "nobody", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken},
	} {
		if v := verdict(c); v.Own {
			t.Fatalf("claim %+v: own", c)
		}
	}
	if f := lc.byID["a"]; f.worker != "w2" || f.state != stClaimed {
		t.Fatalf("held by %q (%s), want w2", f.worker, f.state)
	}
	// Sent to one worker: only that worker's claim is own.
	sent(t, lc, req("b", "interactive"), to("gpu", "w1"), t0)
	if v := verdict(codec.Claim{ID: "b", Attempt: 1, Pool: "gpu", Worker: "w2", State: codec.ClaimTaken}); v.Own {
		t.Fatal("a claim by a worker the attempt was not sent to: own")
	}
	if v := verdict(codec.Claim{ID: "b", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}); !v.Own {
		t.Fatal("the chosen worker's claim: not own")
	}
	// Without a reply subject a claim gets no verdict.
	if out := lc.claim(codec.Claim{ID: "b", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0); len(out) != 0 {
		t.Fatalf("a claim without a reply subject: %+v", out)
	}
}

// L8: an attempt not answered answerGrace past the request's deadline is answered
// deadline_exceeded, once; its timers leave with it.
func TestLifecycleDeadline(t *testing.T) {
	lc := newTestLifecycle()
	p := req("a", "interactive")
	s := sent(t, lc, p, to("gpu", ""), t0)
	lc.claim(codec.Claim{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0)
	if out := lc.tick(p.deadline); len(out) != 0 {
		t.Fatalf("at the deadline (the worker's grace): %+v", out)
	}
	wantCode(t, lc.tick(p.deadline.Add(answerGrace)), "a", codec.CodeDeadlineExceeded)
	if out := lc.reply(s.seq, &nats.Msg{}, p.deadline.Add(2*answerGrace)); len(out) != 0 {
		t.Fatalf("the reply after the deadline's answer: %+v", out)
	}
	empty(t, lc)
}

// L5: no responders in a pool with live workers: out for noResponderBackoff, then queued
// again; in a pool without, no_worker. A send that fails answers internal.
func TestLifecycleNoResponders(t *testing.T) {
	lc := newTestLifecycle()
	s := sent(t, lc, req("a", "interactive"), to("gpu", ""), t0)
	if out := lc.noResponders(s.seq, "ortbus.infer.gpu.interactive", t0); len(out) != 0 || state(lc, "a") != "backoff" || lc.busy["gpu"] != 0 {
		t.Fatalf("no responders, live pool: %+v, state %s", out, state(lc, "a"))
	}
	if lc.tick(t0.Add(noResponderBackoff - time.Millisecond)); state(lc, "a") != "backoff" {
		t.Fatal("queued before the backoff")
	}
	if lc.tick(t0.Add(noResponderBackoff)); state(lc, "a") != "queued" {
		t.Fatalf("after the backoff: %s", state(lc, "a"))
	}
	envOf(lc).live = map[string]bool{}
	s = only[effSend](t, lc.pass(t0.Add(time.Second), to("gpu", "")))
	wantCode(t, lc.noResponders(s.seq, "ortbus.infer.gpu.interactive", t0.Add(time.Second)), "a", codec.CodeNoWorker)

	s = sent(t, lc, req("b", "interactive"), to("gpu", ""), t0)
	wantCode(t, lc.sendFailed("b", s.attempt, codec.Errorf(codec.CodeInternal, "encode"), t0), "b", codec.CodeInternal)
	empty(t, lc)
}

// L9: a cancel answers a queued (or backing off) request cancelled at once; one at a
// worker gets a cancel sent, the worker's answer ends it, and should its worker die
// first it is answered cancelled, not retried. Another owner's cancel finds nothing.
func TestLifecycleCancel(t *testing.T) {
	lc := newTestLifecycle()
	lc.accept(req("q", "interactive"), []string{"gpu"}, t0)
	if found, _ := lc.cancel("q", "_INBOX.x.1", "", false, t0); found {
		t.Fatal("another owner's cancel found it")
	}
	found, out := lc.cancel("q", "_INBOX.c.2", "", false, t0)
	if !found {
		t.Fatal("its owner's cancel found nothing")
	}
	wantCode(t, out, "q", codec.CodeCancelled)

	s := sent(t, lc, req("r", "interactive"), to("gpu", ""), t0)
	lc.claim(codec.Claim{ID: "r", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0)
	found, out = lc.cancel("r", "", "", false, t0) // an operator
	if c := only[effCancel](t, out); !found || c.id != "r" || len(terminals(out)) != 0 || state(lc, "r") != "claimed" {
		t.Fatalf("cancel at a worker: %v %+v, state %s", found, out, state(lc, "r"))
	}
	wantCode(t, lc.died("gpu", "w1", "exit 2", 1, t0), "r", codec.CodeCancelled)
	_ = s

	s = sent(t, lc, req("b", "interactive"), to("gpu", ""), t0)
	lc.noResponders(s.seq, "x", t0)
	_, out = lc.cancel("b", "", "", false, t0)
	wantCode(t, out, "b", codec.CodeCancelled)
	if out := lc.tick(t0.Add(time.Second)); len(out) != 0 {
		t.Fatalf("the backoff's timer after the cancel: %+v", out)
	}
	// onlyKnown: an unknown id is not remembered.
	lc.cancel("gone", "", "", true, t0)
	if _, ok := lc.early["gone"]; ok {
		t.Fatal("an abandoned id remembered as cancelled")
	}
	empty(t, lc)
}

// L10: at shutdown the queued are answered no_worker, and then those at workers
// worker_lost (a request in backoff: TestLifecycleShutdownBackoff).
func TestLifecycleShutdown(t *testing.T) {
	lc := newTestLifecycle()
	sent(t, lc, req("out", "interactive"), to("gpu", ""), t0)
	lc.accept(req("queued", "batch"), []string{"gpu"}, t0)
	out := lc.shutdown(false, t0)
	wantCode(t, out, "queued", codec.CodeNoWorker)
	wantCode(t, lc.shutdown(true, t0), "out", codec.CodeWorkerLost)
	empty(t, lc)
}

// L4 (direct) with L2, the race "a done claim after the client's next request" (replies
// straight to the client: the client has its answer and sends again before the gateway
// hears): the next request waits in the queue while the worker's slot is counted, and
// the done of the first settles the first alone.
func TestLifecycleDoneAfterNextRequest(t *testing.T) {
	lc := newTestLifecycle()
	envOf(lc).direct = true
	a := sent(t, lc, req("a", "interactive"), to("gpu", "w1"), t0)
	lc.accept(req("b", "interactive"), []string{"gpu"}, t0.Add(time.Millisecond))
	if out := lc.pass(t0.Add(time.Millisecond), waits); len(out) != 0 || state(lc, "b") != "queued" {
		t.Fatalf("b while a holds w1: %+v, %s", out, state(lc, "b"))
	}
	st := only[effSettled](t, lc.claim(codec.Claim{ID: "a", Attempt: a.attempt, Pool: "gpu", Worker: "w1", State: codec.ClaimDone}, "", t0.Add(2*time.Millisecond)))
	if st.p.id != "a" || state(lc, "b") != "queued" || lc.workers["w1"]["interactive"] != 0 {
		t.Fatalf("a's done: %+v; b %s, w1 %v", st, state(lc, "b"), lc.workers["w1"])
	}
	if b := only[effSend](t, lc.pass(t0.Add(3*time.Millisecond), to("gpu", "w1"))); b.p.id != "b" {
		t.Fatalf("next pass sent %s", b.p.id)
	}
}

// L1 and L7, the race "a resend during failover": it finds the request held here, by
// its owner, in every state until it is answered (what Gateway.holds reads), and a
// resend run as new with the same id while it is held is refused, never run twice.
func TestLifecycleResendWhileHeld(t *testing.T) {
	lc := newTestLifecycle()
	p := req("a", "interactive")
	held := func() bool { q, ok := lc.get("a"); return ok && q.owner == p.owner }
	lc.accept(p, []string{"gpu"}, t0)
	if !held() {
		t.Fatal("queued: not held")
	}
	s := only[effSend](t, lc.pass(t0, to("gpu", "")))
	if !held() {
		t.Fatal("sent: not held")
	}
	wantCode(t, lc.accept(req("a", "interactive"), []string{"gpu"}, t0), "a", codec.CodeBadRequest)
	lc.died("gpu", "w1", "exit", 0, t0) // its queue group's only worker: retried
	if !held() || state(lc, "a") != "queued" {
		t.Fatalf("retrying: held %v, %s", held(), state(lc, "a"))
	}
	s = only[effSend](t, lc.pass(t0, to("gpu", "")))
	only[effRelay](t, lc.reply(s.seq, &nats.Msg{}, t0))
	if held() {
		t.Fatal("answered: still held")
	}
}

// L1-L10 together: every request gets exactly one terminal effect, whatever the order of
// the events that reach it: a seeded random walk over the events of many requests.
func TestLifecycleOneAnswer(t *testing.T) {
	for seed := range 20 {
		lc := newTestLifecycle()
		env := envOf(lc)
		rnd := uint64(seed*7919 + 1)
		next := func(n int) int { rnd = rnd*6364136223846793005 + 1442695040888963407; return int(rnd>>33) % n }
		answers := map[string]int{}
		count := func(out []effect) {
			for id, n := range terminals(out) {
				answers[id] += n
			}
		}
		now := t0
		ids := 0
		sends := map[string]effSend{}
		for range 400 {
			now = now.Add(time.Duration(next(40)) * time.Millisecond)
			env.direct = next(2) == 0
			switch next(9) {
			case 0, 1:
				ids++
				p := req(fmt.Sprint("r", ids), []string{"urgent", "interactive", "batch"}[next(3)])
				p.deadline = now.Add(time.Duration(next(3000)) * time.Millisecond)
				count(lc.accept(p, []string{"gpu"}, now))
			case 2:
				out := lc.pass(now, to("gpu", []string{"", "w1", "w2"}[next(3)]))
				for _, e := range out {
					if s, ok := e.(effSend); ok {
						sends[s.p.id] = s
					}
				}
				count(out)
			case 3:
				for id, s := range sends {
					state := []string{codec.ClaimTaken, codec.ClaimDone}[next(2)]
					count(lc.claim(codec.Claim{ID: id, Attempt: s.attempt, Pool: "gpu", Worker: []string{"w1", "w2"}[next(2)], State: state}, "", now))
					break
				}
			case 4:
				for _, s := range sends {
					if next(2) == 0 {
						count(lc.reply(s.seq, &nats.Msg{}, now))
					} else {
						count(lc.noResponders(s.seq, "x", now))
					}
					break
				}
			case 5:
				env.live["gpu"] = next(3) > 0
				count(lc.died("gpu", []string{"w1", "w2"}[next(2)], "exit", next(2), now))
			case 6:
				_, out := lc.cancel(fmt.Sprint("r", next(ids+1)), "", "", false, now)
				count(out)
			default:
				count(lc.tick(now))
			}
		}
		count(lc.shutdown(false, now))
		count(lc.shutdown(true, now))
		for i := 1; i <= ids; i++ {
			if id := fmt.Sprint("r", i); answers[id] != 1 {
				t.Fatalf("seed %d: %s answered %d times", seed, id, answers[id])
			}
		}
		empty(t, lc)
	}
}

// L2, its failure arm: a pass answers each item the queue fails with the queue's error,
// once: an item past its deadline deadline_exceeded (sched, rule 4), one the router
// refuses with the router's error (no_worker here). Nothing is held for them.
func TestLifecyclePassFails(t *testing.T) {
	lc := newTestLifecycle()
	late := req("late", "interactive")
	late.deadline = t0.Add(10 * time.Millisecond)
	lc.accept(late, []string{"gpu"}, t0)
	lc.accept(req("refused", "interactive"), []string{"gpu"}, t0)
	refuse := func(*sched.Item, map[string]bool) decision {
		return decision{err: codec.Errorf(codec.CodeNoWorker, "no pool can run it")}
	}
	out := lc.pass(t0.Add(20*time.Millisecond), refuse)
	if n := terminals(out); len(out) != 2 || n["late"] != 1 || n["refused"] != 1 {
		t.Fatalf("the pass: %+v, want one answer each", out)
	}
	for _, e := range out {
		a := e.(effAnswer)
		if want := map[string]codec.Code{"late": codec.CodeDeadlineExceeded, "refused": codec.CodeNoWorker}[a.p.id]; a.err == nil || a.err.Code != want {
			t.Fatalf("%s answered %v, want %s", a.p.id, a.err, want)
		}
	}
	if out := lc.pass(t0.Add(time.Second), refuse); len(out) != 0 {
		t.Fatalf("a second pass: %+v", out)
	}
	empty(t, lc)
}

// L2, its waiting arm: an item the router keeps waiting stays queued, sends nothing and
// holds nothing; a pool the router wakes is woken (effWake), and a waiting item that
// reserves marks its pools' devices active at the pass's time (the sharing policy), one
// that does not reserve marks nothing.
func TestLifecyclePassWaits(t *testing.T) {
	lc := newTestLifecycle()
	lc.accept(req("a", "interactive"), []string{"gpu", "cpu"}, t0)
	now := t0.Add(time.Second)
	out := lc.pass(now, func(*sched.Item, map[string]bool) decision { return decision{wake: "gpu", reserve: true} })
	if w := only[effWake](t, out); len(out) != 1 || w.pool != "gpu" {
		t.Fatalf("the pass: %+v, want one wake of gpu", out)
	}
	if state(lc, "a") != "queued" || lc.queues.Len("interactive") != 1 || lc.busy["gpu"] != 0 || len(lc.timers) != 0 {
		t.Fatalf("a waiting item: %s, queued %d, busy %v, %d timers", state(lc, "a"), lc.queues.Len("interactive"), lc.busy, len(lc.timers))
	}
	for _, dev := range []string{"dev-gpu", "dev-cpu"} {
		if at := lc.active[dev]["interactive"]; !at.Equal(now) {
			t.Fatalf("%s: interactive last active %v, want the pass's %v", dev, at, now)
		}
	}
	lc.accept(req("b", "batch"), []string{"gpu"}, t0)
	if out := lc.pass(now, waits); len(out) != 0 || lc.active["dev-gpu"]["batch"] != (time.Time{}) {
		t.Fatalf("a waiting item that reserves nothing: %+v, batch active %v", out, lc.active["dev-gpu"]["batch"])
	}
}

// L10 for a request in backoff (L5): shutdown answers it no_worker, once, as a queued one;
// at workers it held nothing, so the in-flight round and its backoff timer find nothing.
func TestLifecycleShutdownBackoff(t *testing.T) {
	lc := newTestLifecycle()
	s := sent(t, lc, req("b", "interactive"), to("gpu", ""), t0)
	lc.noResponders(s.seq, "ortbus.infer.gpu.interactive", t0)
	if state(lc, "b") != "backoff" {
		t.Fatalf("after no responders: %s", state(lc, "b"))
	}
	wantCode(t, lc.shutdown(false, t0), "b", codec.CodeNoWorker)
	if out := lc.shutdown(true, t0); len(out) != 0 {
		t.Fatalf("the in-flight round: %+v", out)
	}
	if out := lc.tick(t0.Add(time.Second)); len(out) != 0 {
		t.Fatalf("the backoff's timer after shutdown: %+v", out)
	}
	empty(t, lc)
}

// L9 bounded (the job runner's cancel): a cancel of a request at a worker, with a bound,
// sends the cancel; the worker's answer within the bound ends it as ever; without one,
// the cancel timer answers it cancelled at the bound, once, and gives its unit back. A
// queued one is answered at once, as by any cancel.
func TestLifecycleCancelTimer(t *testing.T) {
	const bound = 5 * time.Second
	lc := newTestLifecycle()
	sent(t, lc, req("a", "batch"), to("gpu", ""), t0)
	lc.claim(codec.Claim{ID: "a", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0)
	found, out := lc.cancelWithin("a", "", "", false, bound, t0)
	if c := only[effCancel](t, out); !found || c.id != "a" || len(terminals(out)) != 0 {
		t.Fatalf("bounded cancel at a worker: %v %+v", found, out)
	}
	if _, out := lc.cancelWithin("a", "", "", false, bound, t0.Add(bound/2)); len(terminals(out)) != 0 {
		t.Fatalf("a second cancel: %+v", out)
	}
	if out := lc.tick(t0.Add(bound - time.Millisecond)); len(out) != 0 {
		t.Fatalf("before the bound: %+v", out)
	}
	wantCode(t, lc.tick(t0.Add(bound)), "a", codec.CodeCancelled)
	if out := lc.tick(t0.Add(2 * bound)); len(out) != 0 {
		t.Fatalf("after the cancel timer's answer: %+v", out)
	}
	empty(t, lc)

	// Its worker answers within the bound: that answer, and the timer finds nothing.
	s := sent(t, lc, req("b", "batch"), to("gpu", ""), t0)
	lc.cancelWithin("b", "", "", false, bound, t0)
	only[effRelay](t, lc.reply(s.seq, &nats.Msg{}, t0.Add(time.Second)))
	if out := lc.tick(t0.Add(bound)); len(out) != 0 {
		t.Fatalf("the cancel timer after the worker's answer: %+v", out)
	}
	// Queued: answered at once.
	lc.accept(req("q", "batch"), []string{"gpu"}, t0)
	_, out = lc.cancelWithin("q", "", "", false, bound, t0)
	wantCode(t, out, "q", codec.CodeCancelled)
	empty(t, lc)
}

// L7 with L3/L4's guards, the race "a draining beat after exit": a worker's exit (its
// death) retries what it held; its last words that arrive afterwards — a claim taken or
// done for the attempt it held, a relayed reply to it, a second verdict of its death —
// neither bring the attempt back to it nor answer the request a second time. With no
// other worker, the death answers worker_lost, and the late words add nothing.
func TestLifecycleDrainingBeatAfterExit(t *testing.T) {
	lc := newTestLifecycle()
	env := envOf(lc)
	answers := map[string]int{}
	count := func(out []effect) []effect {
		for id, n := range terminals(out) {
			answers[id] += n
		}
		return out
	}
	r := sent(t, lc, req("r", "interactive"), to("gpu", ""), t0) // relayed, to the queue group
	env.direct = true
	sent(t, lc, req("d", "interactive"), to("gpu", "w1"), t0) // direct, to w1 itself
	count(lc.claim(codec.Claim{ID: "r", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0))
	count(lc.claim(codec.Claim{ID: "d", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0))

	// w1 exits; w2 lives on.
	now := t0.Add(time.Second)
	if out := count(lc.died("gpu", "w1", "exit 0", 1, now)); len(out) != 2 || state(lc, "r") != "queued" || state(lc, "d") != "queued" {
		t.Fatalf("w1's exit: %+v; r %s, d %s", out, state(lc, "r"), state(lc, "d"))
	}
	late := func(when string) {
		t.Helper()
		for _, id := range []string{"r", "d"} {
			for _, st := range []string{codec.ClaimTaken, codec.ClaimDone} {
				if out := count(lc.claim(codec.Claim{ID: id, Attempt: 1, Pool: "gpu", Worker: "w1", State: st}, "", now)); len(out) != 0 {
					t.Fatalf("%s: w1's late %s claim of %s: %+v", when, st, id, out)
				}
			}
		}
		if out := count(lc.reply(r.seq, &nats.Msg{}, now)); len(out) != 0 {
			t.Fatalf("%s: w1's late reply: %+v", when, out)
		}
	}
	late("queued again")
	// Sent again, to the group and to w2: w1's late words reach neither attempt.
	env.direct = false
	sends := map[string]effSend{}
	for _, e := range count(lc.pass(now, func(it *sched.Item, _ map[string]bool) decision {
		if it.ID == "d" {
			return decision{pool: "gpu", worker: "w2"}
		}
		return decision{pool: "gpu"}
	})) {
		s := e.(effSend)
		sends[s.p.id] = s
	}
	r2 := sends["r"]
	if len(sends) != 2 || r2.attempt != 2 || sends["d"].attempt != 2 {
		t.Fatalf("the retries: %+v", sends)
	}
	late("sent again")
	if w := lc.byID["r"].worker; w != "" || state(lc, "r") != "sent" {
		t.Fatalf("r's retry taken back by the dead w1: worker %q, %s", w, state(lc, "r"))
	}
	// A second verdict of w1's death: it holds nothing now.
	if out := count(lc.died("gpu", "w1", "heartbeat stopped", 1, now)); len(out) != 0 || lc.byID["r"].deaths != 1 || lc.byID["d"].deaths != 1 {
		t.Fatalf("w1 dead again: %+v; deaths r %d, d %d", out, lc.byID["r"].deaths, lc.byID["d"].deaths)
	}
	count(lc.reply(r2.seq, &nats.Msg{}, now))
	count(lc.claim(codec.Claim{ID: "d", Attempt: 2, Pool: "gpu", Worker: "w2", State: codec.ClaimTaken}, "", now))
	count(lc.tick(now.Add(time.Minute + answerGrace)))
	if answers["r"] != 1 || answers["d"] != 1 {
		t.Fatalf("answers %v, want one each", answers)
	}
	empty(t, lc)

	// The pool's only worker exits, and nothing else can run it: worker_lost, once.
	lc = newTestLifecycle()
	env = envOf(lc)
	sent(t, lc, req("x", "interactive"), to("gpu", "w1"), t0)
	lc.claim(codec.Claim{ID: "x", Attempt: 1, Pool: "gpu", Worker: "w1", State: codec.ClaimTaken}, "", t0)
	env.live = map[string]bool{} // its draining beat does not make it live (health's rule)
	wantCode(t, lc.died("gpu", "w1", "exit 0", 0, t0), "x", codec.CodeWorkerLost)
	for _, st := range []string{codec.ClaimTaken, codec.ClaimDone} {
		if out := lc.claim(codec.Claim{ID: "x", Attempt: 1, Pool: "gpu", Worker: "w1", State: st}, "", t0); len(out) != 0 {
			t.Fatalf("w1's late %s claim after its answer: %+v", st, out)
		}
	}
	empty(t, lc)
}
