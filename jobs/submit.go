package jobs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// wireItem is one item's message in ORTBUS_JOB_ITEMS.
type wireItem struct {
	Job   string `msgpack:"j"`
	Index int    `msgpack:"i"`
	Path  string `msgpack:"p"`
}

// publishChunk bounds the items published before waiting for their acks.
const publishChunk = 512

// Submit records the job and publishes its items, and answers {job, total}. A submit
// naming a job that exists with the same spec publishes its items again, which JetStream
// drops as duplicates (and rule 1 answers any that were already run): it is safe to send
// again after a lost reply. With another spec it is refused.
func (s *Store) Submit(ctx context.Context, rec *Record, paths []string) (*codec.JobSubmitReply, *codec.Error) {
	return s.SubmitWith(ctx, rec, paths, nil)
}

// Precomputed answers a job's item at its submit, when it can: an incremental job's item
// whose result the gateway's cache holds. It returns the op's reply (msgpack), or nil:
// the item is published to run. It must be safe for concurrent use.
type Precomputed func(ctx context.Context, index int, path string) []byte

// preAtOnce bounds the Precomputed calls running at once.
const preAtOnce = 16

// SubmitWith is Submit whose items pre answers are recorded at once, each as its one
// result (marked cached, Item.FromCache), instead of being published to run; a result the
// store does not take is published as an item instead, to run. The reply waits for
// every item to be answered or published, as Submit's.
func (s *Store) SubmitWith(ctx context.Context, rec *Record, paths []string, pre Precomputed) (*codec.JobSubmitReply, *codec.Error) {
	if len(paths) > s.cfg.MaxItems {
		return nil, codec.Errorf(codec.CodeBadRequest, "%d items, over jobs.max_items (%d)", len(paths), s.cfg.MaxItems).With("field", "items")
	}
	// The id is the owner's own (owner.go): kept under its key, answered as given.
	id := rec.Job
	if id == "" {
		id = nuid.Next()
	}
	if e := checkOwnID(rec.Owner, id); e != nil {
		return nil, e
	}
	rec.Job = Key(rec.Owner, id)
	if rec.Owner != "" {
		rec.Name = id
	}
	rec.Total = len(paths)
	rec.Items = itemsDigest(paths)
	rec.Created = time.Now().UnixMilli()
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, codec.Errorf(codec.CodeInternal, "encode job: %v", err)
	}
	created := false
	if _, err := s.kv.Create(ctx, rec.Job, data); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, storeError("record the job", err)
		}
		old, err := s.record(ctx, rec.Job)
		if err != nil || old == nil {
			return nil, storeError("read the job", err)
		}
		if old.Owner != rec.Owner || old.Name != rec.Name {
			// Keys are per owner, so this is no other owner's job met by chance (a record
			// kept before keys were, or a hash collision): say nothing of it, and never
			// answer with its results.
			return nil, codec.Errorf(codec.CodeConflict, "job id %s is taken; submit without an id, or with another", id).With("job", id)
		}
		if !sameSpec(old, rec) {
			return nil, codec.Errorf(codec.CodeConflict, "job %s exists with another op, model, class, pool, options or items", id).With("job", id)
		}
		if old.Cancel != 0 {
			return nil, codec.Errorf(codec.CodeCancelled, "job %s was cancelled", id).With("job", id)
		}
		if old.Failed != 0 {
			return nil, failedJob(old, id)
		}
		rec = old
	} else {
		created = true
		s.cache(rec)
	}
	if e := s.publishItems(ctx, rec, paths, pre); e != nil {
		// Half a new job would never finish: take it back whole; the client may submit
		// again. A re-submit leaves the job as it was (its items are all published or
		// will be by the next re-submit).
		if created {
			s.forget(context.WithoutCancel(ctx), rec.Job)
		}
		return nil, e
	}
	return &codec.JobSubmitReply{Job: id, Total: rec.Total, Skipped: rec.Skipped, SkippedTotal: rec.SkippedTotal}, nil
}

// publishItems publishes one message per path, in chunks, and waits for each chunk's
// acks; the items pre answers are recorded as results instead (SubmitWith).
func (s *Store) publishItems(ctx context.Context, rec *Record, paths []string, pre Precomputed) *codec.Error {
	job := rec.Job
	subj := subjects.JobItems(job)
	publishItem := func(i int) (jetstream.PubAckFuture, *codec.Error) {
		b, err := codec.Marshal(&wireItem{Job: job, Index: i, Path: paths[i]})
		if err != nil {
			return nil, codec.Errorf(codec.CodeInternal, "encode item: %v", err)
		}
		f, err := s.js.PublishAsync(subj, b, jetstream.WithMsgID(job+":"+strconv.Itoa(i)), jetstream.WithExpectStream(ItemsStream))
		if err != nil {
			return nil, storeError("publish items", err)
		}
		return f, nil
	}
	for start := 0; start < len(paths); start += publishChunk {
		end := min(start+publishChunk, len(paths))
		answers := s.precompute(ctx, pre, paths, start, end)
		type pending struct {
			i      int
			result bool
			f      jetstream.PubAckFuture
		}
		var futures []pending
		for i := start; i < end; i++ {
			if body := answers[i-start]; body != nil {
				cached := true
				msg, err := resultMsg(Item{Job: rec, Index: i, Path: paths[i], cached: &cached}, body, nil, false)
				if err == nil {
					if f, err := s.js.PublishMsgAsync(msg, jetstream.WithExpectStream(ResultsStream)); err == nil {
						futures = append(futures, pending{i, true, f})
						continue
					}
				}
			}
			f, e := publishItem(i)
			if e != nil {
				return e
			}
			futures = append(futures, pending{i, false, f})
		}
		if e := s.awaitPublished(ctx); e != nil {
			return e
		}
		var retry []pending
		for _, p := range futures {
			select {
			case <-p.f.Ok():
			case err := <-p.f.Err():
				if !p.result {
					return storeError("publish items", err)
				}
				// A result the store did not take (full, a second one for the item: a
				// re-submit): the item runs instead, under the rules of consume.go.
				f, e := publishItem(p.i)
				if e != nil {
					return e
				}
				retry = append(retry, pending{p.i, false, f})
			}
		}
		if len(retry) > 0 {
			if e := s.awaitPublished(ctx); e != nil {
				return e
			}
			for _, p := range retry {
				select {
				case <-p.f.Ok():
				case err := <-p.f.Err():
					return storeError("publish items", err)
				}
			}
		}
	}
	return nil
}

// awaitPublished waits for the async publishes in flight to be acknowledged.
func (s *Store) awaitPublished(ctx context.Context) *codec.Error {
	select {
	case <-s.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return storeError("publish items", ctx.Err())
	}
}

// precompute calls pre for paths[start:end], preAtOnce at a time, and returns its answers
// (all nil without pre).
func (s *Store) precompute(ctx context.Context, pre Precomputed, paths []string, start, end int) [][]byte {
	out := make([][]byte, end-start)
	if pre == nil {
		return out
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(preAtOnce, end-start) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i-start] = pre(ctx, i, paths[i])
			}
		}()
	}
	for i := start; i < end; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// forget removes a job's record and waiting items.
func (s *Store) forget(ctx context.Context, job string) {
	if err := s.items.Purge(ctx, jetstream.WithPurgeSubject(subjects.JobItems(job))); err != nil {
		s.log.Warn("purge job items", "job", job, "err", err)
	}
	if err := s.kv.Purge(ctx, job); err != nil {
		s.log.Warn("remove job record", "job", job, "err", err)
	}
	s.mu.Lock()
	delete(s.records, job)
	delete(s.tallies, job)
	s.mu.Unlock()
}

// sameSpec reports whether two records ask for the same work.
func sameSpec(a, b *Record) bool {
	x, y := *a, *b
	if x.Items == "" || y.Items == "" {
		x.Items, y.Items = "", "" // a record written before items were digested
	}
	x.Created, y.Created, x.Cancel, y.Cancel = 0, 0, 0, 0
	x.Failed, y.Failed, x.Reason, y.Reason = 0, 0, nil, nil
	x.Incremental, y.Incremental = false, false // how items are answered, not which work
	x.Anytime, y.Anytime = false, false         // when items run, not which work
	x.Paused, y.Paused = 0, 0
	x.Skipped, y.Skipped, x.SkippedTotal, y.SkippedTotal = nil, nil, 0, 0 // what was left out, not the work
	bx, _ := json.Marshal(&x)
	by, _ := json.Marshal(&y)
	return bytes.Equal(bx, by)
}

// itemsDigest is the SHA-256 of a job's item paths, in order, each ended by a NUL (which
// no path holds).
func itemsDigest(paths []string) string {
	h := sha256.New()
	for _, p := range paths {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// decodeRecord reads a record from the bucket (which only gateways write; still checked).
func decodeRecord(b []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if codec.CheckJobID(r.Job) != nil || r.Total < 0 {
		return nil, errors.New("malformed job record")
	}
	return &r, nil
}

// failedJob is the answer to a re-submit of a failed job, named id by its submitter: why
// it failed.
func failedJob(r *Record, id string) *codec.Error {
	code, why := codec.CodeInternal, "no reason recorded"
	if r.Reason != nil {
		code, why = r.Reason.Code, r.Reason.Message
	}
	return codec.Errorf(code, "job %s failed: %s", id, why).With("job", id)
}

// storeError is the API's answer when JetStream failed: overloaded when a stream (or
// JetStream's storage) is full, unavailable when it cannot be reached, internal otherwise.
func storeError(what string, err error) *codec.Error {
	switch {
	case err == nil:
		return codec.Errorf(codec.CodeInternal, "%s: not found", what)
	case refusalOf(err) == storeFull:
		return codec.Errorf(codec.CodeOverloaded, "%s: the job store is full (jobs.items_max_bytes, jobs.results_max_bytes, or JetStream's storage): %v", what, err)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, nats.ErrNoResponders): // a stream between leaders (a cluster's node lost, or just formed)
		return codec.Errorf(codec.CodeUnavailable, "%s: JetStream did not answer: %v", what, err)
	}
	return codec.Errorf(codec.CodeInternal, "%s: %v", what, err)
}
