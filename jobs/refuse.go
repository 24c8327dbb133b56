package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// Rule 7: storage never stalls a job. Every write of an item's run mark or result goes
// through write, which tells JetStream's refusals apart (refusalOf): a refusal for good
// fails the job (storeFailed), a transient one is retried within a bound, and nothing is
// retried without end.

// JetStream API error codes (nats-server's jetstream_errors_generated.go) that the client
// library does not name: the stream's store refused the message (the description is the
// store's own error), and the account or the server has no room left.
const (
	errCodeStoreFailed           jetstream.ErrorCode = 10077 // JSStreamStoreFailedF
	errCodeAccountResources      jetstream.ErrorCode = 10002 // JSAccountResourcesExceededErr
	errCodeInsufficientResources jetstream.ErrorCode = 10023 // JSInsufficientResourcesErr
	errCodeMemoryResources       jetstream.ErrorCode = 10028 // JSMemoryResourcesExceededErr
	errCodeStorageResources      jetstream.ErrorCode = 10047 // JSStorageResourcesExceededErr
)

// The store's errors behind errCodeStoreFailed (nats-server's store.go ErrMaxBytes,
// ErrMaxMsgs, ErrMsgTooLarge) that say a message will not be taken as it is, whenever it
// is sent again. ("maximum messages per subject exceeded" means the subject has its one
// message: write checks for that first.)
const (
	storeMaxBytes    = "maximum bytes exceeded"
	storeMaxMsgs     = "maximum messages exceeded"
	storeMsgTooLarge = "message too large"
)

// refusal is what a failed write to the job store means.
type refusal int

const (
	// transient: the store did not answer, or not now (a timeout, no responders, a
	// leader being elected, a stream being restarted): worth trying again, for a while.
	transient refusal = iota
	// storeFull: the stream is at its max_bytes or max_msgs (discard new), or the
	// account or server is out of storage: no write fits until an operator acts or old
	// results age out (jobs.results_max_age).
	storeFull
	// msgTooLarge: this message is over the stream's or the server's size limit; a
	// smaller one would be taken.
	msgTooLarge
)

// refusalOf classifies an error from a JetStream publish.
func refusalOf(err error) refusal {
	if errors.Is(err, nats.ErrMaxPayload) {
		return msgTooLarge
	}
	var ae *jetstream.APIError
	if !errors.As(err, &ae) {
		return transient
	}
	switch ae.ErrorCode {
	case jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return msgTooLarge
	case errCodeAccountResources, errCodeInsufficientResources, errCodeMemoryResources, errCodeStorageResources:
		return storeFull
	case errCodeStoreFailed:
		switch ae.Description {
		case storeMaxBytes, storeMaxMsgs:
			return storeFull
		case storeMsgTooLarge:
			return msgTooLarge
		}
	}
	return transient
}

// storeRetryMin is the least time a transient refusal is retried, however short
// jobs.ack_wait is: a leader election takes seconds.
const storeRetryMin = 10 * time.Second

// errTaken: the subject holds its one message already (the item has its result, or the
// run mark is taken).
var errTaken = errors.New("the subject holds its message already")

// refusedError is a write the store did not take: for good (storeFull, msgTooLarge), or
// not within the bound (transient, after that long).
type refusedError struct {
	kind  refusal
	after time.Duration
	err   error
}

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// write publishes msg on the results stream, which keeps one message per subject. It
// returns nil once taken, errTaken when the subject has its message (whatever the store
// said: a full stream refuses a second message too), a *refusedError at once for a
// refusal for good, and, for a transient one, tries again (pausing 100 ms, doubling to
// 5 s) for at most s.storeRetry before it returns a *refusedError. The caller keeps the
// item held meanwhile (rule 4), so it is not delivered elsewhere while this retries.
func (s *Store) write(ctx context.Context, msg *nats.Msg) error {
	start := time.Now()
	wait := 100 * time.Millisecond
	for {
		_, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(ResultsStream))
		if err == nil {
			return nil
		}
		if _, gerr := s.results.GetLastMsgForSubject(ctx, msg.Subject); gerr == nil {
			return errTaken
		}
		if ctx.Err() != nil {
			return err
		}
		kind := refusalOf(err)
		if kind != transient || time.Since(start) >= s.storeRetry {
			return &refusedError{kind: kind, after: time.Since(start), err: err}
		}
		s.log.Warn("the job store did not take a write; trying again", "subject", msg.Subject, "err", err, "after", wait)
		if !sleep(ctx, wait) {
			return err
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// storeFailed settles an item whose run mark or result (what) the store did not take
// (rule 7): its job fails with the reason, and the item is acknowledged. Where the
// failure cannot be recorded either (JetStream is gone altogether), the item is left to
// be delivered again after ack_wait.
func (s *Store) storeFailed(ctx context.Context, it Item, what string, err error) outcome {
	reason := storeReason(it.Index, what, err)
	s.log.Warn("job failed: the job store did not take an item's "+what, "job", it.Job.Job, "item", it.Index, "err", err)
	if _, ferr := s.finish(ctx, it.Job.Job, func(r *Record) { r.Failed, r.Reason = time.Now().UnixMilli(), reason }); ferr != nil {
		s.log.Warn("record that a job failed", "job", it.Job.Job, "err", ferr)
		return left
	}
	return settled
}

// storeReason is why a job failed when item n's write (what) was not taken.
func storeReason(n int, what string, err error) *codec.Error {
	what = fmt.Sprintf("item %d: record its %s", n, what)
	var r *refusedError
	if errors.As(err, &r) && r.kind == transient {
		return codec.Errorf(codec.CodeUnavailable, "%s: JetStream did not take it within %s: %v", what, r.after.Round(time.Millisecond), r.err).With("item", n)
	}
	return storeError(what, err).With("item", n)
}

// finish marks job's record as finished by mark (cancelled or failed) unless it is
// finished already, with a compare-and-set on the bucket (another gateway may write it
// meanwhile); stops the job's items running here (the other gateways stop theirs from
// the bucket's watch) and removes its waiting ones. It returns the record as it is now,
// nil when there is no such job.
func (s *Store) finish(ctx context.Context, job string, mark func(*Record)) (*Record, error) {
	rec, err := s.update(ctx, job, mark)
	if rec == nil || err != nil {
		return rec, err
	}
	s.stopRunning(job)
	s.dropParked(ctx, job)
	if err := s.items.Purge(ctx, jetstream.WithPurgeSubject(subjects.JobItems(job))); err != nil {
		// The record says finished, which is what counts: an item left waiting is
		// dropped unrun when it is delivered (consume).
		s.log.Warn("remove a finished job's waiting items", "job", job, "err", err)
	}
	return rec, nil
}

// update applies mark to job's record in the bucket, unless the job is finished (then the
// record stays as it is), and returns the record as it now is (nil, nil: no such job).
// The write is conditional on the revision read: one another gateway made meanwhile is
// read again and mark applied to it.
func (s *Store) update(ctx context.Context, job string, mark func(*Record)) (*Record, error) {
	for attempt := 0; ; attempt++ {
		e, err := s.kv.Get(ctx, job)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		rec, err := decodeRecord(e.Value())
		if err != nil {
			return nil, err
		}
		if !rec.finished() {
			mark(rec)
			b, err := json.Marshal(rec)
			if err != nil {
				return nil, err
			}
			if _, err := s.kv.Update(ctx, job, b, e.Revision()); err != nil {
				if attempt < 5 {
					continue // another gateway wrote it meanwhile
				}
				return nil, err
			}
		}
		s.cache(rec)
		return rec, nil
	}
}
