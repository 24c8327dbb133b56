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

// Parking: the items of a job held unrun — paused (rule 8), or outside the windows and not
// anytime (rule 9) — leave the work queue, so that they hold none of the consumer's
// max_ack_pending and the items behind them run. An item of a held job delivered to a
// gateway is written to the bucket ParkedBucket under <job>.<n> and acknowledged; a
// resume, a window that opens and a gateway that starts inside a window publish parked
// items again (unpark), each under the message id <job>:<n>:p<revision> (the revision of
// its parked entry) and delete their keys. Between the two:
//
//   - a parker reads the record again from the bucket (never from its cache) after it
//     parked the item: if the job is no longer held, it publishes the item itself, under
//     the same message id as any other publisher of that entry, so JetStream's duplicate
//     window keeps one;
//   - a cancelled or failed job's parked items are deleted (finish), never published.

// ParkedBucket holds the parked items of held jobs.
const ParkedBucket = "ortbus_jobs_parked"

// parkKey is the key of item n of job in ParkedBucket.
func parkKey(job string, n int) string { return job + "." + strconv.Itoa(n) }

// park takes an item of a held job out of the work queue (the caller acknowledges it
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
	rec, err := s.fresh(ctx, w.Job)
	switch {
	case err != nil:
		// Parked: a resume, a window or a gateway's start publishes it.
	case rec == nil || rec.finished():
		s.parked.Delete(ctx, parkKey(w.Job, w.Index))
	case !s.holds(rec):
		// No longer held (resumed, a window opened) while it was being parked: whoever
		// unparked may have listed the bucket before this item was in it.
		s.unparkOne(ctx, w.Job, w.Index)
	}
	return settled
}

// fresh reads job's record from the bucket, not the cache (nil, nil: no such job).
func (s *Store) fresh(ctx context.Context, job string) (*Record, error) {
	e, err := s.kv.Get(ctx, job)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeRecord(e.Value())
}

// unpark publishes every parked item of job again and deletes their keys.
func (s *Store) unpark(ctx context.Context, job string) error {
	keys, err := s.parkedKeys(ctx, job+".*")
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
		if err := s.unparkOne(ctx, job, n); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// unparkAll publishes again the parked items of every job that is neither held nor
// finished, and drops those of finished jobs (rule 9: a window opened).
func (s *Store) unparkAll(ctx context.Context) {
	keys, err := s.parkedKeys(ctx, ">")
	if err != nil {
		s.log.Warn("list the parked job items", "err", err)
		return
	}
	jobs := map[string]bool{}
	for _, k := range keys {
		if i := strings.LastIndexByte(k, '.'); i > 0 {
			jobs[k[:i]] = true
		}
	}
	for job := range jobs {
		rec, err := s.fresh(ctx, job)
		switch {
		case err != nil:
			s.log.Warn("read a job with parked items", "job", job, "err", err)
		case rec == nil || rec.finished():
			s.dropParked(ctx, job)
		case !s.holds(rec):
			if err := s.unpark(ctx, job); err != nil {
				s.log.Warn("publish a job's parked items", "job", job, "err", err)
			}
		}
	}
}

// unparkOne publishes item n of job from the bucket to the work queue and deletes its key.
func (s *Store) unparkOne(ctx context.Context, job string, n int) error {
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
	msgID := job + ":" + strconv.Itoa(n) + ":p" + strconv.FormatUint(e.Revision(), 10)
	if _, err := s.js.Publish(ctx, subjects.JobItems(job), e.Value(), jetstream.WithMsgID(msgID), jetstream.WithExpectStream(ItemsStream)); err != nil {
		return err
	}
	return s.parked.Delete(ctx, k)
}

// parkedKeys lists the keys of the parked items that filter matches.
func (s *Store) parkedKeys(ctx context.Context, filter string) ([]string, error) {
	lister, err := s.parked.ListKeysFiltered(ctx, filter)
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
	keys, err := s.parkedKeys(ctx, job+".*")
	if err != nil {
		s.log.Warn("remove a finished job's parked items", "job", job, "err", err)
		return
	}
	for _, k := range keys {
		s.parked.Delete(ctx, k)
	}
}
