package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// Rule 7: storage never stalls a job. These tests make the results stream refuse writes
// and check that the job ends, and how.

// checkFor waits, polling every 20 ms, until f returns nil, for at most total
// (testenv.CheckFor).
func checkFor(t *testing.T, total time.Duration, f func() error) {
	t.Helper()
	testenv.CheckFor(t, "the stream's state", total, 20*time.Millisecond, f)
}

// limitResults changes the results stream's limits as an operator could.
func limitResults(t *testing.T, nc *nats.Conn, limit func(*jetstream.StreamConfig)) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(context.Background(), ResultsStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	limit(&cfg)
	if _, err := js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
}

// settledAll waits until no item of any job waits, or is held by a gateway: nothing is
// left to run or to retry.
func settledAll(t *testing.T, s *Store) {
	t.Helper()
	checkFor(t, 30*time.Second, func() error {
		st, err := s.Stats(context.Background())
		if err != nil {
			return err
		}
		if st.Pending != 0 || st.AckPending != 0 || st.Held != 0 {
			return fmt.Errorf("items not settled: %+v", st)
		}
		return nil
	})
}

// A job whose results (or run marks) no longer fit the results stream fails, saying
// why, instead of retrying its items for ever; its other items are removed unrun.
func TestJobFailsWhenTheResultsStoreIsFull(t *testing.T) {
	for _, c := range []struct {
		name  string
		limit func(*jetstream.StreamConfig)
	}{
		{"max_bytes", func(c *jetstream.StreamConfig) { c.MaxBytes = 2048 }},
		{"max_msgs", func(c *jetstream.StreamConfig) { c.MaxMsgs = 9 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			nc := testenv.InProcessJetStream(t)
			s := open(t, nc)
			limitResults(t, nc, c.limit)
			var r runs
			consume(t, s, 4, r.runner(nil))
			const n = 40
			rec := func() *Record { return &Record{Job: "full", Op: "tag", Class: "batch"} }
			if _, e := s.Submit(context.Background(), rec(), paths(n)); e != nil {
				t.Fatal(e)
			}
			st := waitStatus(t, s, "full", (*codec.JobStatus).Finished)
			if st.State != codec.JobFailed || st.FinishedUnixMS == 0 || st.Done+st.Failed >= n || st.Running != 0 {
				t.Fatalf("status %+v: want failed before every item was answered", st)
			}
			if st.Error == nil || st.Error.Code != codec.CodeOverloaded || !strings.Contains(st.Error.Message, "job store is full") {
				t.Fatalf("reason %v: want overloaded, the job store is full", st.Error)
			}
			t.Logf("the job failed: %v", st.Error)
			settledAll(t, s)
			for i := range n {
				if k := r.count(i); k > 1 {
					t.Errorf("item %d ran %d times", i, k)
				}
			}
			// The failure is for good: the job says so to a re-submit, and a cancel leaves it.
			if _, e := s.Submit(context.Background(), rec(), paths(n)); e == nil || e.Code != codec.CodeOverloaded {
				t.Fatalf("re-submit of a failed job: %v", e)
			}
			if st, e := s.Cancel(context.Background(), "full", ""); e != nil || st.State != codec.JobFailed {
				t.Fatalf("cancel of a failed job: %+v %v", st, e)
			}
		})
	}
}

// A result over the store's size limit is the item's error reply_too_large; the job goes
// on and is done.
func TestJobResultTooLargeForTheStore(t *testing.T) {
	nc := testenv.InProcessJetStream(t)
	s := open(t, nc)
	limitResults(t, nc, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 })
	var r runs
	consume(t, s, 2, r.runner(func(it Item) ([]byte, *codec.Error) {
		if it.Index == 1 {
			b, _ := codec.Marshal(&codec.TagReply{Served: codec.Served{ID: it.ID()}, General: map[string]float32{strings.Repeat("x", 4096): 1}})
			return b, nil
		}
		return tagReply(it), nil
	}))
	if _, e := s.Submit(context.Background(), &Record{Job: "big", Op: "tag", Class: "batch"}, paths(3)); e != nil {
		t.Fatal(e)
	}
	st := waitStatus(t, s, "big", (*codec.JobStatus).Finished)
	if st.State != codec.JobDone || st.Done != 2 || st.Failed != 1 {
		t.Fatalf("status %+v: want done, 2 done and 1 failed", st)
	}
	for _, x := range allResults(t, s, "big", 0) {
		if (x.Index == 1) != (x.Error != nil) || x.Error != nil && x.Error.Code != codec.CodeReplyTooLarge {
			t.Fatalf("item %d: %+v; want item 1 alone answered reply_too_large", x.Index, x.Error)
		}
	}
	for i := range 3 {
		if k := r.count(i); k != 1 {
			t.Errorf("item %d ran %d times", i, k)
		}
	}
}

// logSignal is a slog handler that tells when a message containing what is logged.
type logSignal struct {
	slog.Handler
	what string
	seen chan struct{}
}

func (h *logSignal) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.what) {
		select {
		case h.seen <- struct{}{}:
		default:
		}
	}
	return h.Handler.Handle(ctx, r)
}

// A store that does not answer for a while (here: the results stream is gone, then made
// again) is waited for, within the bound; past the bound the job fails as unavailable.
func TestJobStoreTransientFailure(t *testing.T) {
	for _, recovers := range []bool{true, false} {
		t.Run(fmt.Sprintf("recovers=%v", recovers), func(t *testing.T) {
			nc := testenv.InProcessJetStream(t)
			sig := &logSignal{Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}),
				what: "job store did not take", seen: make(chan struct{}, 1)}
			s, err := Open(context.Background(), nc, testConfig(), slog.New(sig))
			if err != nil {
				t.Fatal(err)
			}
			if !recovers {
				s.storeRetry = 300 * time.Millisecond
			}
			started, release := make(chan struct{}, 1), make(chan struct{})
			var r runs
			consume(t, s, 1, r.runner(func(it Item) ([]byte, *codec.Error) {
				started <- struct{}{}
				<-release
				return tagReply(it), nil
			}))
			if _, e := s.Submit(context.Background(), &Record{Job: "blink", Op: "tag", Class: "batch"}, paths(1)); e != nil {
				t.Fatal(e)
			}
			<-started
			js, _ := jetstream.New(nc)
			if err := js.DeleteStream(context.Background(), ResultsStream); err != nil {
				t.Fatal(err)
			}
			close(release)
			<-sig.seen // the result's write was refused (and is being retried, or failed the job)
			if !recovers {
				checkFor(t, 30*time.Second, func() error {
					e, err := s.kv.Get(context.Background(), "blink")
					if err != nil {
						return err
					}
					if rec, err := decodeRecord(e.Value()); err != nil || rec.Failed == 0 {
						return fmt.Errorf("job not failed yet: %v", err)
					}
					return nil
				})
			}
			if _, err := Open(context.Background(), nc, testConfig(), slog.New(sig)); err != nil { // the stream again
				t.Fatal(err)
			}
			st := waitStatus(t, s, "blink", (*codec.JobStatus).Finished)
			switch {
			case recovers && (st.State != codec.JobDone || st.Done != 1):
				t.Fatalf("status %+v: want done once the store answers again", st)
			case !recovers && (st.State != codec.JobFailed || st.Error == nil || st.Error.Code != codec.CodeUnavailable):
				t.Fatalf("status %+v (%v): want failed, unavailable", st, st.Error)
			}
			t.Logf("the job ended %s: %v", st.State, st.Error)
			settledAll(t, s)
			if k := r.count(0); k != 1 {
				t.Fatalf("the item ran %d times", k)
			}
		})
	}
}
