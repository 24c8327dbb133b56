package jobs

import (
	"context"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestSubmitWithPrecomputed: items a Precomputed answers at the submit are recorded as
// cached results and never run; items whose runner says FromCache are counted cached too;
// the rest computed. Status and results say which.
func TestSubmitWithPrecomputed(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := open(t, nc)
	var r runs
	consume(t, s, 8, r.runner(func(it Item) ([]byte, *codec.Error) {
		if it.Index%4 == 1 {
			it.FromCache() // answered from the cache when it ran (a duplicate's flight)
		}
		return tagReply(it), nil
	}))
	pre := func(_ context.Context, i int, path string) []byte {
		if i%2 == 0 {
			return tagReply(Item{Job: &Record{Job: "inc"}, Index: i, Path: path})
		}
		return nil
	}
	rep, e := s.SubmitWith(context.Background(), &Record{Job: "inc", Op: "tag", Class: "batch", Incremental: true}, paths(100), pre)
	if e != nil || rep.Total != 100 {
		t.Fatalf("submit: %+v %v", rep, e)
	}
	st := waitStatus(t, s, "inc", (*codec.JobStatus).Finished)
	if st.State != codec.JobDone || st.Done != 100 || st.Cached != 75 || st.Computed != 25 {
		t.Fatalf("status %+v: want 100 done, 75 cached, 25 computed", st)
	}
	for i := range 100 {
		if n := r.count(i); (i%2 == 0) != (n == 0) {
			t.Errorf("item %d ran %d times", i, n)
		}
	}
	res := allResults(t, s, "inc", 0)
	if len(res) != 100 {
		t.Fatalf("%d results", len(res))
	}
	for _, x := range res {
		if want := x.Index%2 == 0 || x.Index%4 == 1; x.Cached != want {
			t.Errorf("item %d: cached %v, want %v", x.Index, x.Cached, want)
		}
		if x.Error != nil || x.Result == nil {
			t.Errorf("item %d: %v", x.Index, x.Error)
		}
	}
	// A re-submit runs nothing again and changes no count.
	if _, e := s.SubmitWith(context.Background(), &Record{Job: "inc", Op: "tag", Class: "batch", Incremental: true}, paths(100), pre); e != nil {
		t.Fatal(e)
	}
	if st := waitStatus(t, s, "inc", (*codec.JobStatus).Finished); st.Done != 100 || st.Cached != 75 {
		t.Fatalf("after a re-submit: %+v", st)
	}
}
