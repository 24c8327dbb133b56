package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestIncrementalSmall runs the incremental bench at a tiny size (200 images) and checks
// its counts, which are exact whatever the machine's load: every first job computes all,
// the unchanged rescan computes none, the changed rescans exactly the 2 changed and 2
// added, and the revision recomputes all of tagger-a and none of tagger-b. The speedup
// is a figure of the full bench (docs/BENCHMARKS.md), not checked here.
func TestIncrementalSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a gateway with JetStream; skipped with -short")
	}
	root := testenv.RepoRoot(t)
	testenv.RuntimeLib(t, RuntimeVersion)
	bin := buildSystem(t, root)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const n, k = 200, 2
	var table bytes.Buffer
	rep, err := Incremental(ctx, Options{Repo: root, BinDir: bin, N: n, Out: &table})
	t.Logf("incremental, %d images:\n%s", n, table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*IncrementalResults)
	want := []struct{ items, computed, cached int }{
		{n, n, 0}, {n, n, 0}, // first, each tagger
		{n, 0, n},                                    // unchanged rescan
		{n + k, 2 * k, n - k}, {n + k, 2 * k, n - k}, // changed, each tagger
		{n + k, n + k, 0}, {n + k, 0, n + k}, // after tagger-a's revision
	}
	if len(res.Phases) != len(want) {
		t.Fatalf("%d phases, want %d", len(res.Phases), len(want))
	}
	for i, w := range want {
		p := res.Phases[i]
		if p.Items != w.items || p.Computed != w.computed || p.Cached != w.cached || p.Failed != 0 || p.ElapsedS <= 0 {
			t.Errorf("phase %q (%s): %+v, want %d items, %d computed, %d cached", p.Phase, p.Model, p, w.items, w.computed, w.cached)
		}
	}
	if !res.ChangedExact || !res.RevisionExact {
		t.Errorf("verdicts: changed exact %v, revision exact %v", res.ChangedExact, res.RevisionExact)
	}
	// (How many files a rescan hashes again depends on when they were written: the racy
	// rule hashes a file again within 2 s of its change. The cache package's tests check it.)
	if p := res.Phases[2]; p.CacheBytes == 0 || p.Stats < uint64(n) {
		t.Errorf("the unchanged rescan: %d stats, %d cache bytes", p.Stats, p.CacheBytes)
	}
}
