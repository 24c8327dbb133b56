package jobs

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// Parking: the waiting items of a paused job leave the work queue (rule 8), so that they
// hold none of the consumer's max_ack_pending and the other jobs' items behind them run.
// An item of a paused job delivered to a gateway is written to the bucket ParkedBucket
// under <job>.<n> and acknowledged; a resume (Pause with paused false) publishes every
// parked item of the job again, with the message id <job>:<n>:r<resumes> (the record's
// count of resumes), and deletes its key. Between the two:
//
//   - a parker reads the record again from the bucket (never from its cache) after it
//     parked the item: if the job was resumed meanwhile, it publishes the item itself,
//     under the same message id as the resume, so JetStream's duplicate window keeps one;
//   - a cancelled or failed job's parked items are deleted (finish), never published.

// ParkedBucket holds the parked items of paused jobs.
const ParkedBucket = "ortbus_jobs_parked"

// parkKey is the key of item n of job in ParkedBucket.
func parkKey(job string, n int) string { return job + "." + strconv.Itoa(n) }

// park takes an item of a paused job out of the work queue (the caller acknowledges it
// when park says settled).
func (s *Store) park(ctx context.Context, w wireItem) outcome {
	b, err := codec.Marshal(&w)
	if err != nil {
		return left
	}
	if _, err := s.parked.Put(ctx, parkKey(w.Job, w.Index), b); err != nil {
		if ctx.Err() != nil {
			return handedOn
		}
		return deferred // not parked: delivered again after pausedRedelivery
	}
	e, err := s.kv.Get(ctx, w.Job)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		s.parked.Delete(ctx, parkKey(w.Job, w.Index))
		return settled
	}
	if err != nil {
		return settled // parked: a resume publishes it
	}
	rec, err := decodeRecord(e.Value())
	if err != nil || rec.Paused != 0 {
		return settled
	}
	if rec.finished() {
		s.parked.Delete(ctx, parkKey(w.Job, w.Index))
		return settled
	}
	// Resumed while it was being parked: the resume may have listed the bucket before
	// this item was in it.
	if s.unparkOne(ctx, w.Job, w.Index, rec.Resumes) != nil {
		return settled // still parked: the next resume publishes it
	}
	return settled
}

// unpark publishes every parked item of job again (its resume number resumes) and
// deletes their keys.
func (s *Store) unpark(ctx context.Context, job string, resumes int) error {
	keys, err := s.parkedKeys(ctx, job)
	if err != nil {
		return err
	}
	var first error
	for _, k := range keys {
		n, err := strconv.Atoi(strings.TrimPrefix(k, job+"."))
		if err != nil || n < 0 {
			s.parked.Delete(ctx, k)
			continue
		}
		if err := s.unparkOne(ctx, job, n, resumes); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// unparkOne publishes item n of job from the bucket to the work queue and deletes its key.
func (s *Store) unparkOne(ctx context.Context, job string, n, resumes int) error {
	k := parkKey(job, n)
	e, err := s.parked.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil // published by another
	}
	if err != nil {
		return err
	}
	var w wireItem
	if codec.Unmarshal(e.Value(), &w) != nil || w.Job != job || w.Index != n {
		s.parked.Delete(ctx, k)
		return nil
	}
	msgID := job + ":" + strconv.Itoa(n) + ":r" + strconv.Itoa(resumes)
	if _, err := s.js.Publish(ctx, subjects.JobItems(job), e.Value(), jetstream.WithMsgID(msgID), jetstream.WithExpectStream(ItemsStream)); err != nil {
		return err
	}
	return s.parked.Delete(ctx, k)
}

// parkedKeys lists the keys of job's parked items.
func (s *Store) parkedKeys(ctx context.Context, job string) ([]string, error) {
	lister, err := s.parked.ListKeysFiltered(ctx, job+".*")
	if err != nil {
		return nil, err
	}
	defer lister.Stop()
	var keys []string
	seen := map[string]bool{} // a listing may report a key twice
	for k := range lister.Keys() {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// dropParked deletes a finished job's parked items.
func (s *Store) dropParked(ctx context.Context, job string) {
	keys, err := s.parkedKeys(ctx, job)
	if err != nil {
		s.log.Warn("remove a finished job's parked items", "job", job, "err", err)
		return
	}
	for _, k := range keys {
		s.parked.Delete(ctx, k)
	}
}
