package jobs

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// tally is what this gateway has counted of a job's results: every result up to stream
// sequence seq. Results are unique per item, so counting each message once is exact.
type tally struct {
	mu                        sync.Mutex
	seq                       uint64
	done, failed, redelivered int
	cached                    int
	recent                    []time.Time // times of the latest results, for the rate
	last                      time.Time
}

// rateWindow is how far back the rate looks; maxRecent bounds what it keeps.
const (
	rateWindow = time.Minute
	maxRecent  = 512
)

func (s *Store) tallyOf(job string) *tally {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tallies[job]
	if !ok {
		if len(s.tallies) >= maxCached {
			for k := range s.tallies {
				delete(s.tallies, k)
				break
			}
		}
		t = &tally{}
		s.tallies[job] = t
	}
	return t
}

// count brings t up to date with the job's results: only their headers are read, and
// only those after the last one counted.
func (s *Store) count(ctx context.Context, job string, t *tally) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	last, err := s.results.GetLastMsgForSubject(ctx, subjects.JobResults(job))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if last.Sequence <= t.seq {
		return nil
	}
	cons, err := s.results.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subjects.JobResults(job)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    t.seq + 1,
		HeadersOnly:    true,
		// Gone soon after its last use: a client polling a job's status often would
		// otherwise leave a consumer per poll for minutes (the server bounds them).
		InactiveThreshold: readerIdle,
	})
	if err != nil {
		return err
	}
	defer s.dropReader(ctx, cons)
	for t.seq < last.Sequence {
		batch, err := cons.FetchNoWait(1024)
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			n++
			t.seq = md.Sequence.Stream
			if m.Headers().Get(HeaderOutcome) == outcomeOK {
				t.done++
			} else {
				t.failed++
			}
			if m.Headers().Get(HeaderRedelivered) != "" {
				t.redelivered++
			}
			if m.Headers().Get(HeaderCached) != "" {
				t.cached++
			}
			t.last = md.Timestamp
			t.recent = append(t.recent, md.Timestamp)
			if len(t.recent) > maxRecent {
				t.recent = t.recent[len(t.recent)-maxRecent:]
			}
		}
		if err := batch.Error(); err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	return nil
}

// readerIdle is how long the server keeps an ordered consumer that reads results (count,
// Results) once it is idle: each is deleted after its read (dropReader), and this bounds
// those whose delete was lost.
const readerIdle = 10 * time.Second

// dropReader deletes an ordered consumer after its read, best effort.
func (s *Store) dropReader(ctx context.Context, cons jetstream.Consumer) {
	if info := cons.CachedInfo(); info != nil {
		s.results.DeleteConsumer(context.WithoutCancel(ctx), info.Name)
	}
}

// Status reports owner's job, named by owner's id for it.
func (s *Store) Status(ctx context.Context, job, owner string) (*codec.JobStatus, *codec.Error) {
	rec, e := s.owned(ctx, job, owner)
	if e != nil {
		return nil, e
	}
	return s.status(ctx, rec, owner)
}

// owned reads the record of owner's job id (its key, owner.go): a job of another owner
// is unknown_job, as if it did not exist (the local owner "" reaches every job, a
// account's by its key).
func (s *Store) owned(ctx context.Context, job, owner string) (*Record, *codec.Error) {
	rec, err := s.record(ctx, Key(owner, job))
	if err != nil {
		return nil, storeError("read the job", err)
	}
	if rec == nil || !ownedBy(rec, owner) || viewID(rec, owner) != job {
		return nil, unknownJob(job)
	}
	return rec, nil
}

// ownedBy reports whether owner may see rec: its own owner, or the local owner "".
func ownedBy(rec *Record, owner string) bool { return owner == "" || rec.Owner == owner }

func unknownJob(job string) *codec.Error {
	return codec.Errorf(codec.CodeUnknownJob, "no job %q (never submitted, or older than jobs.results_max_age)", job).With("job", job)
}

// status is rec's status as viewer sees it (named by viewID).
func (s *Store) status(ctx context.Context, rec *Record, viewer string) (*codec.JobStatus, *codec.Error) {
	t := s.tallyOf(rec.Job)
	if err := s.count(ctx, rec.Job, t); err != nil {
		return nil, storeError("count results", err)
	}
	t.mu.Lock()
	st := &codec.JobStatus{Job: viewID(rec, viewer), Op: rec.Op, Model: rec.Model, Class: rec.Class, Pool: rec.Pool, Total: rec.Total,
		Done: t.done, Failed: t.failed, Redelivered: t.redelivered, StartedUnixMS: rec.Created, State: codec.JobRunning,
		Cached: t.cached, Computed: t.done + t.failed - t.cached, Skipped: rec.Skipped, SkippedTotal: rec.SkippedTotal}
	recent, last := slices.Clone(t.recent), t.last
	t.mu.Unlock()
	left := rec.Total - st.Done - st.Failed
	switch {
	case rec.Cancel != 0:
		st.State, st.FinishedUnixMS = codec.JobCancelled, rec.Cancel
	case rec.Failed != 0:
		st.State, st.FinishedUnixMS, st.Error = codec.JobFailed, rec.Failed, rec.Reason
	case left <= 0:
		st.State, st.FinishedUnixMS = codec.JobDone, last.UnixMilli()
		if d := last.Sub(time.UnixMilli(rec.Created)).Seconds(); d > 0 {
			st.RatePerS = float64(rec.Total) / d
		}
		return st, nil
	case rec.Paused != 0:
		st.State, st.PausedUnixMS = codec.JobPaused, rec.Paused
	}
	if st.State == codec.JobRunning || st.State == codec.JobPaused {
		st.Running = s.inFlight(ctx, rec.Job, left)
		// The rate over the last minute of results; the ETA at that rate.
		now := time.Now()
		i, _ := slices.BinarySearchFunc(recent, now.Add(-rateWindow), func(a, b time.Time) int { return a.Compare(b) })
		if w := recent[i:]; len(w) >= 2 {
			if d := now.Sub(w[0]).Seconds(); d > 0 {
				st.RatePerS = float64(len(w)) / d
				st.EtaS = float64(left) / st.RatePerS
			}
		}
	}
	return st, nil
}

// inFlight estimates a job's items delivered and not yet answered: its items still in the
// work queue, bounded by all items delivered and unacknowledged on the consumer (which
// other running jobs share).
func (s *Store) inFlight(ctx context.Context, job string, left int) int {
	subj := subjects.JobItems(job)
	info, err := s.items.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return 0
	}
	ci, err := s.cons.Info(ctx)
	if err != nil {
		return 0
	}
	return min(int(info.State.Subjects[subj]), ci.NumAckPending, left)
}

// maxList bounds job.list.
const maxList = 100

// List reports owner's jobs kept (every job for the local owner ""), newest first (at
// most 100).
func (s *Store) List(ctx context.Context, owner string) (*codec.JobListReply, *codec.Error) {
	lister, err := s.kv.ListKeys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, storeError("list jobs", err)
	}
	var recs []*Record
	if lister != nil {
		for k := range lister.Keys() {
			if r, err := s.record(ctx, k); err == nil && r != nil && ownedBy(r, owner) {
				recs = append(recs, r)
			}
		}
	}
	slices.SortFunc(recs, func(a, b *Record) int { return int(b.Created - a.Created) })
	out := &codec.JobListReply{Jobs: []codec.JobStatus{}}
	for _, r := range recs[:min(len(recs), maxList)] {
		if st, e := s.status(ctx, r, owner); e == nil {
			out.Jobs = append(out.Jobs, *st)
		}
	}
	return out, nil
}

// Results pages through a job's results in the order they were recorded: from stream
// sequence req.From, at most req.Limit (default and cap 1000), and no more than maxBytes
// of encoded results (at least one).
func (s *Store) Results(ctx context.Context, req *codec.JobResultsRequest, owner string, maxBytes int) (*codec.JobResultsReply, *codec.Error) {
	rec, e := s.owned(ctx, req.Job, owner)
	if e != nil {
		return nil, e
	}
	limit := req.Limit
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	out := &codec.JobResultsReply{Job: req.Job, Op: rec.Op, Results: []codec.JobResult{}, Next: max(req.From, 1)}
	last, err := s.results.GetLastMsgForSubject(ctx, subjects.JobResults(rec.Job))
	if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && last.Sequence < out.Next {
		return out, nil
	}
	if err != nil {
		return nil, storeError("read results", err)
	}
	cons, err := s.results.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{subjects.JobResults(rec.Job)},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       out.Next,
		InactiveThreshold: readerIdle,
	})
	if err != nil {
		return nil, storeError("read results", err)
	}
	defer s.dropReader(ctx, cons)
	batch, err := cons.FetchNoWait(limit)
	if err != nil {
		return nil, storeError("read results", err)
	}
	size := 0
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		if size > maxBytes {
			continue // the rest of the batch is read again from Next
		}
		var r storedResult
		res := codec.JobResult{Seq: md.Sequence.Stream, Index: itemIndex(m.Subject())}
		if err := codec.Unmarshal(m.Data(), &r); err != nil {
			res.Error = codec.Errorf(codec.CodeInternal, "stored result is malformed: %v", err)
		} else {
			res.Path, res.Error, res.Cached = r.Path, r.Error, r.Cached
			if r.Error == nil {
				v := codec.NewReply(rec.Op)
				if err := codec.Unmarshal(r.Result, v); err != nil {
					res.Error = codec.Errorf(codec.CodeInternal, "stored result is malformed: %v", err)
				} else {
					res.Result = v
				}
			}
		}
		size += len(m.Data())
		out.Results = append(out.Results, res)
		out.Next = md.Sequence.Stream + 1
	}
	if err := batch.Error(); err != nil && len(out.Results) == 0 {
		return nil, storeError("read results", err)
	}
	out.More = out.Next <= last.Sequence
	return out, nil
}

// Cancel cancels a job: no item of it runs any more (those running are stopped, here and
// at every gateway that watches the bucket), its waiting items are removed, and what it
// has done stays readable. A job that failed stays failed.
func (s *Store) Cancel(ctx context.Context, job, owner string) (*codec.JobStatus, *codec.Error) {
	own, e := s.owned(ctx, job, owner)
	if e != nil {
		return nil, e
	}
	rec, err := s.finish(ctx, own.Job, func(r *Record) { r.Cancel = time.Now().UnixMilli() })
	if err != nil {
		return nil, storeError("cancel the job", err)
	}
	if rec == nil {
		return nil, unknownJob(job)
	}
	return s.status(ctx, rec, owner)
}

// Pause pauses job (paused true) or resumes it, for owner: while paused its items running
// finish and no other starts (consume, rule 8); a finished job stays as it is. Either is
// idempotent; the answer is the job's status.
func (s *Store) Pause(ctx context.Context, job, owner string, paused bool) (*codec.JobStatus, *codec.Error) {
	own, e := s.owned(ctx, job, owner)
	if e != nil {
		return nil, e
	}
	rec, err := s.update(ctx, own.Job, func(r *Record) {
		switch {
		case !paused:
			r.Paused = 0
		case r.Paused == 0:
			r.Paused = time.Now().UnixMilli()
		}
	})
	if err != nil {
		return nil, storeError("pause the job", err)
	}
	if rec == nil {
		return nil, unknownJob(job)
	}
	if !paused && !rec.finished() && !s.holds(rec) {
		// Its parked items go back to the work queue (rule 8; outside the windows, a job
		// not anytime keeps them until one opens: rule 9). A resume again publishes what
		// one that failed here left.
		if err := s.unpark(ctx, rec.Job); err != nil {
			return nil, storeError("resume the job's parked items", err)
		}
	}
	return s.status(ctx, rec, owner)
}

// stopRunning cancels the items of job running here.
func (s *Store) stopRunning(job string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cancel := range s.running[job] {
		cancel()
	}
}

// Watch follows the bucket until ctx ends, so that a job cancelled or failed at another
// gateway stops here too.
func (s *Store) Watch(ctx context.Context) {
	w, err := s.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		s.log.Warn("watch job records", "err", err)
		return
	}
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil {
			continue
		}
		if e.Operation() != jetstream.KeyValuePut {
			s.mu.Lock()
			delete(s.records, e.Key())
			delete(s.anytime, e.Key())
			s.mu.Unlock()
			continue
		}
		rec, err := decodeRecord(e.Value())
		if err != nil {
			continue
		}
		s.cache(rec)
		if rec.finished() {
			s.stopRunning(rec.Job)
		}
	}
}

// Stats are the store's figures for the gateway's /metrics.
type Stats struct {
	// ActiveJobs counts the jobs with items not yet settled (the work-queue stream keeps
	// an item until it is acknowledged).
	ActiveJobs int
	// Pending is the consumer's lag: items not yet delivered to any gateway.
	Pending uint64
	// AckPending counts the items delivered and not yet settled, over all gateways;
	// Redelivered those of them delivered more than once.
	AckPending, Redelivered int
	// Held and Acked are this gateway's: items it holds now, items it has settled.
	Held  int
	Acked uint64
}

// Stats reads the figures from JetStream (two requests).
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	st := Stats{Held: s.holding(), Acked: s.acked.Load()}
	ci, err := s.cons.Info(ctx)
	if err != nil {
		return st, err
	}
	st.Pending, st.AckPending, st.Redelivered = ci.NumPending, ci.NumAckPending, ci.NumRedelivered
	info, err := s.items.Info(ctx, jetstream.WithSubjectFilter(subjects.JobItemPrefix+".>"))
	if err != nil {
		return st, err
	}
	st.ActiveJobs = len(info.State.Subjects)
	return st, nil
}

// Running counts the jobs running now (submitted, not yet done, cancelled or failed):
// all of them, and those of owner; it stops counting at limit jobs in all (a submit's
// check: past it the submit is refused whatever the rest). A job's done and failed items
// come from its cached tally, brought up to date; no in-flight count is asked for.
func (s *Store) Running(ctx context.Context, owner string, limit int) (all, own int, e *codec.Error) {
	lister, err := s.kv.ListKeys(ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return 0, 0, nil
		}
		return 0, 0, storeError("list jobs", err)
	}
	defer lister.Stop()
	for k := range lister.Keys() {
		r, err := s.record(ctx, k)
		if err != nil || r == nil || r.finished() {
			continue
		}
		t := s.tallyOf(r.Job)
		if s.count(ctx, r.Job, t) != nil {
			continue
		}
		t.mu.Lock()
		left := r.Total - t.done - t.failed
		t.mu.Unlock()
		if left <= 0 {
			continue
		}
		all++
		if r.Owner == owner {
			own++
		}
		if all >= limit {
			break
		}
	}
	return all, own, nil
}

// Owns reports whether owner's job id names a job that exists and owner may reach (the
// local owner "" reaches every job, an account's by its key).
func (s *Store) Owns(ctx context.Context, job, owner string) bool {
	_, e := s.owned(ctx, job, owner)
	return e == nil
}
