package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestLeaseSmall runs `bench lease` for one round of each way and checks what holds
// whatever the load: the waiting way sends one acquire a round, the polling baseline more
// than one; each grant comes after the holder began to free its memory, and leaves the
// holder's lease shrunk to its measured resident memory. Not its latencies (a bench's
// figures, docs/BENCHMARKS.md).
func TestLeaseSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway and holders of 400 MiB, and polls for 10 s; skipped with -short")
	}
	root := testenv.RepoRoot(t)
	bin := buildSystem(t, root)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var table bytes.Buffer
	rep, err := Lease(ctx, Options{Repo: root, BinDir: bin, N: 1, Out: &table})
	t.Logf("lease, one round each:\n%s", table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*LeaseResults)
	if res.Wait.AcquireRequests != 1 || len(res.Wait.Rounds) != 1 {
		t.Errorf("waiting in the gateway: %d acquires over %d rounds, want 1 and 1", res.Wait.AcquireRequests, len(res.Wait.Rounds))
	}
	if res.Polling.AcquireRequests < 2 || len(res.Polling.Rounds) != 1 {
		t.Errorf("polling: %d acquires over %d rounds, want 2 or more (refused, then granted) and 1", res.Polling.AcquireRequests, len(res.Polling.Rounds))
	}
	for _, r := range append(res.Wait.Rounds, res.Polling.Rounds...) {
		// Shrunk below what it held: how far depends on when the grant came in its
		// unmapping (a grant can come as soon as the measure makes room, before the last
		// pages are gone), so the figure is not compared with the urgent lease's room.
		if r.FreeStartToGrantMS <= 0 || r.ShrunkTo <= 0 || r.ShrunkTo >= res.HolderBytes {
			t.Errorf("round %+v: want the grant after the free began, the holder's lease shrunk to what it measures", r)
		}
	}
	for _, n := range rep.Notes {
		t.Errorf("note: %s", n)
	}
}
