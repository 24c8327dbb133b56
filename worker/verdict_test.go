package worker

import (
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// The verdicts' rules (verdict.go), on jobs made here: no NATS, no runtime.

// verdictJob is a job of request id's attempt whose context's cancel is counted.
func verdictJob(id string, attempt int, cancels *int) *job {
	return &job{item: &codec.WorkItem{Request: codec.Request{ID: id}, Attempt: attempt}, deadline: time.Now().Add(time.Minute), cancel: func() { *cancels++ }}
}

// expectFor registers j's wait in v, as the serving side does.
func expectFor(v *verdicts, j *job) {
	j.verdict = v.expect(j.item.ID, j.item.Attempt, j.cancel, j.deadline)
}

// Rules 1 and 3: a reply waits for its verdict; Own sends it once, whenever the reply
// and the verdict come.
func TestVerdictOwnSends(t *testing.T) {
	v := newVerdicts()
	var cancels, sent int
	send := func() { sent++ }
	parked := verdictJob("a", 1, &cancels)
	expectFor(v, parked)
	v.deliver(parked.verdict, 10, send)
	if sent != 0 || v.parked != 1 || v.parkedBytes != 10 {
		t.Fatalf("before its verdict: sent %d, parked %d (%d bytes)", sent, v.parked, v.parkedBytes)
	}
	v.decide(codec.ClaimVerdict{ID: "a", Attempt: 1, Own: true})
	v.decide(codec.ClaimVerdict{ID: "a", Attempt: 1, Own: true}) // a repeat: rule 4
	if sent != 1 || v.parked != 0 || v.parkedBytes != 0 || len(v.waiting) != 0 {
		t.Fatalf("after its verdict: sent %d, parked %d (%d bytes), waiting %d", sent, v.parked, v.parkedBytes, len(v.waiting))
	}
	early := verdictJob("b", 2, &cancels)
	expectFor(v, early)
	v.decide(codec.ClaimVerdict{ID: "b", Attempt: 2, Own: true})
	v.deliver(early.verdict, 10, send)
	if sent != 2 || cancels != 0 || v.dropped.Load() != 0 {
		t.Fatalf("verdict first: sent %d, cancels %d, dropped %d", sent, cancels, v.dropped.Load())
	}
}

// Rules 2 and 4: not Own cancels the job and drops its reply, parked or still to come;
// a verdict of another attempt or id changes nothing.
func TestVerdictNotOwnDrops(t *testing.T) {
	v := newVerdicts()
	var cancels, sent int
	send := func() { sent++ }
	running := verdictJob("a", 1, &cancels)
	expectFor(v, running)
	v.decide(codec.ClaimVerdict{ID: "a", Attempt: 2, Own: true}) // another attempt
	v.decide(codec.ClaimVerdict{ID: "z", Attempt: 1, Own: true}) // another id
	if len(v.waiting) != 1 || cancels != 0 {
		t.Fatalf("verdicts of others: waiting %d, cancels %d", len(v.waiting), cancels)
	}
	v.decide(codec.ClaimVerdict{ID: "a", Attempt: 1})
	if cancels != 1 {
		t.Fatalf("not own: %d cancels, want the job's context cancelled", cancels)
	}
	v.deliver(running.verdict, 10, send) // its answer, after the cancel
	parked := verdictJob("b", 1, &cancels)
	expectFor(v, parked)
	v.deliver(parked.verdict, 10, send)
	v.decide(codec.ClaimVerdict{ID: "b", Attempt: 1})
	if sent != 0 || v.dropped.Load() != 2 || v.parked != 0 || len(v.waiting) != 0 {
		t.Fatalf("sent %d, dropped %d, parked %d, waiting %d; want nothing sent, two dropped", sent, v.dropped.Load(), v.parked, len(v.waiting))
	}
}

// Rule 3's bounds: past maxParked replies, or maxParkedBytes, a reply is dropped at once;
// one whose verdict does not come in time is dropped by its timer.
func TestVerdictParkedBounds(t *testing.T) {
	v := newVerdicts()
	var cancels, sent int
	send := func() { sent++ }
	for i := range maxParked {
		j := verdictJob("p", i+1, &cancels)
		expectFor(v, j)
		v.deliver(j.verdict, 1, send)
	}
	over := verdictJob("over", 1, &cancels)
	expectFor(v, over)
	v.deliver(over.verdict, 1, send)
	if v.parked != maxParked || v.dropped.Load() != 1 || len(v.waiting) != maxParked {
		t.Fatalf("past maxParked: parked %d, dropped %d, waiting %d", v.parked, v.dropped.Load(), len(v.waiting))
	}
	big := newVerdicts()
	huge := verdictJob("huge", 1, &cancels)
	expectFor(big, huge)
	big.deliver(huge.verdict, maxParkedBytes+1, send)
	if big.parked != 0 || big.dropped.Load() != 1 {
		t.Fatalf("past maxParkedBytes: parked %d, dropped %d", big.parked, big.dropped.Load())
	}

	timed := newVerdicts()
	timed.grace = 0
	j := verdictJob("t", 1, &cancels)
	j.deadline = time.Now().Add(-time.Second)
	expectFor(timed, j)
	timed.deliver(j.verdict, 1, send)
	timed.waitParked(time.Minute) // returns once its timer dropped it
	timed.decide(codec.ClaimVerdict{ID: "t", Attempt: 1, Own: true})
	if sent != 0 || timed.dropped.Load() != 1 || timed.parked != 0 || len(timed.waiting) != 0 {
		t.Fatalf("no verdict in time: sent %d, dropped %d, parked %d", sent, timed.dropped.Load(), timed.parked)
	}
}
