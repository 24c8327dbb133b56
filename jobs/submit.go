package jobs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"time"

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
	if len(paths) > s.cfg.MaxItems {
		return nil, codec.Errorf(codec.CodeBadRequest, "%d items, over jobs.max_items (%d)", len(paths), s.cfg.MaxItems).With("field", "items")
	}
	if rec.Job == "" {
		rec.Job = nuid.Next()
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
		if old.Owner != rec.Owner {
			// Another owner's job: say nothing of it, and never answer with its results.
			return nil, codec.Errorf(codec.CodeConflict, "job id %s is taken; submit without an id, or with another", rec.Job).With("job", rec.Job)
		}
		if !sameSpec(old, rec) {
			return nil, codec.Errorf(codec.CodeConflict, "job %s exists with another op, model, class, pool, options or items", rec.Job).With("job", rec.Job)
		}
		if old.Cancel != 0 {
			return nil, codec.Errorf(codec.CodeCancelled, "job %s was cancelled", rec.Job).With("job", rec.Job)
		}
		if old.Failed != 0 {
			return nil, failedJob(old)
		}
		rec = old
	} else {
		created = true
		s.cache(rec)
	}
	if e := s.publishItems(ctx, rec.Job, paths); e != nil {
		// Half a new job would never finish: take it back whole; the client may submit
		// again. A re-submit leaves the job as it was (its items are all published or
		// will be by the next re-submit).
		if created {
			s.forget(context.WithoutCancel(ctx), rec.Job)
		}
		return nil, e
	}
	return &codec.JobSubmitReply{Job: rec.Job, Total: rec.Total}, nil
}

// publishItems publishes one message per path, in chunks, and waits for each chunk's acks.
func (s *Store) publishItems(ctx context.Context, job string, paths []string) *codec.Error {
	subj := subjects.JobItems(job)
	for start := 0; start < len(paths); start += publishChunk {
		var futures []jetstream.PubAckFuture
		for i := start; i < min(start+publishChunk, len(paths)); i++ {
			b, err := codec.Marshal(&wireItem{Job: job, Index: i, Path: paths[i]})
			if err != nil {
				return codec.Errorf(codec.CodeInternal, "encode item: %v", err)
			}
			f, err := s.js.PublishAsync(subj, b, jetstream.WithMsgID(job+":"+strconv.Itoa(i)), jetstream.WithExpectStream(ItemsStream))
			if err != nil {
				return storeError("publish items", err)
			}
			futures = append(futures, f)
		}
		select {
		case <-s.js.PublishAsyncComplete():
		case <-ctx.Done():
			return storeError("publish items", ctx.Err())
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return storeError("publish items", err)
			}
		}
	}
	return nil
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

// failedJob is the answer to a re-submit of a failed job: why it failed.
func failedJob(r *Record) *codec.Error {
	code, why := codec.CodeInternal, "no reason recorded"
	if r.Reason != nil {
		code, why = r.Reason.Code, r.Reason.Message
	}
	return codec.Errorf(code, "job %s failed: %s", r.Job, why).With("job", r.Job)
}

// storeError is the API's answer when JetStream failed: overloaded when a stream (or
// JetStream's storage) is full, unavailable when it cannot be reached, internal otherwise.
func storeError(what string, err error) *codec.Error {
	switch {
	case err == nil:
		return codec.Errorf(codec.CodeInternal, "%s: not found", what)
	case refusalOf(err) == storeFull:
		return codec.Errorf(codec.CodeOverloaded, "%s: the job store is full (jobs.items_max_bytes, jobs.results_max_bytes, or JetStream's storage): %v", what, err)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return codec.Errorf(codec.CodeUnavailable, "%s: JetStream did not answer: %v", what, err)
	}
	return codec.Errorf(codec.CodeInternal, "%s: %v", what, err)
}
