package jobs

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// Headers of a result message: the outcome (ok or the error code), and whether the item
// was delivered more than once.
const (
	HeaderOutcome     = "Ortbus-Outcome"
	HeaderRedelivered = "Ortbus-Redelivered"
	HeaderCached      = "Ortbus-Cached"
	outcomeOK         = "ok"
)

// storedResult is a result message's body.
type storedResult struct {
	Index  int                `msgpack:"i"`
	Path   string             `msgpack:"path"`
	Result msgpack.RawMessage `msgpack:"result,omitempty"`
	Error  *codec.Error       `msgpack:"error,omitempty"`
	Cached bool               `msgpack:"cached,omitempty"`
}

// Host is the gateway that runs the items a consumer takes (Consume).
type Host interface {
	// Room is how many items the gateway takes at once now (those held included).
	Room() int
	// RunItem runs one item (see Runner).
	RunItem(ctx context.Context, it Item) ([]byte, *codec.Error)
}

// Consume runs items until ctx ends: it fetches as many as h's Room says this gateway can
// take beyond those it holds, and handles each in its own goroutine with h's Run.
func (s *Store) Consume(ctx context.Context, h Host) {
	backoff := 100 * time.Millisecond
	inWindow := false
	for ctx.Err() == nil {
		if in := s.cfg.InWindow(s.now()); in != inWindow {
			inWindow = in
			if in { // rule 9: a window opened (or this gateway started in one)
				s.unparkAll(ctx)
			}
		}
		n := h.Room() - s.holding()
		if n <= 0 {
			s.pause(ctx, 200*time.Millisecond)
			continue
		}
		batch, err := s.cons.Fetch(min(n, 64), jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("fetch job items", "err", err)
			}
			s.pause(ctx, backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		for m := range batch.Messages() {
			if ctx.Err() != nil {
				s.handBack(m) // delivered to a fetch of a gateway that is stopping
				continue
			}
			s.hold(1)
			go s.handle(ctx, m, h.RunItem)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.Canceled) {
			s.log.Warn("fetch job items", "err", err)
			s.pause(ctx, backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// fetchWait is how long a fetch waits for items.
const fetchWait = time.Second

// handBack returns an item this gateway will not run (it is stopping) to JetStream for
// the next gateway. It is delivered again after a pause longer than a fetch, so that it
// is not delivered to this gateway's last fetch again, rather than after ack_wait.
func (s *Store) handBack(m jetstream.Msg) { m.NakWithDelay(2 * fetchWait) }

// Wake makes Consume look for room now (a batch slot came free).
func (s *Store) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Store) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-s.wake:
	case <-t.C:
	}
}

// sleep waits d, or less when ctx ends first (then false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (s *Store) hold(n int) {
	s.mu.Lock()
	s.held += n
	s.mu.Unlock()
}

func (s *Store) holding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// Held is how many items this gateway holds (delivered here, not yet finished).
func (s *Store) Held() int { return s.holding() }

// outcome is what becomes of a delivered item once handled.
type outcome int

const (
	settled  outcome = iota // acknowledged: it has its result, or will never run
	handedOn                // handed back now, to the next gateway (this one stops)
	left                    // left to JetStream, which delivers it again after ack_wait
	deferred                // handed back unrun, delivered again after pausedRedelivery
)

// pausedRedelivery is how long an item of a paused job that could not be parked (rule 8:
// its bucket did not take it) waits before it is delivered again.
const pausedRedelivery = 5 * time.Second

// handle follows the rules of the package doc for one delivered item.
func (s *Store) handle(ctx context.Context, m jetstream.Msg, run Runner) {
	defer s.hold(-1)
	defer s.Wake()
	md, err := m.Metadata()
	var w wireItem
	if err != nil || codec.Unmarshal(m.Data(), &w) != nil || codec.CheckJobID(w.Job) != nil || w.Index < 0 || m.Subject() != subjects.JobItems(w.Job) {
		s.log.Warn("malformed job item dropped", "subject", m.Subject())
		m.Term()
		return
	}
	if ctx.Err() != nil {
		s.handBack(m)
		return
	}
	stop := s.keepAlive(ctx, m) // rule 4, until the item is settled or let go
	out := s.follow(ctx, w, md.NumDelivered > 1, run)
	stop()
	switch out {
	case settled:
		s.ack(m)
	case handedOn:
		s.handBack(m)
	case deferred:
		m.NakWithDelay(pausedRedelivery)
	}
}

// follow takes a delivered item through the rules and says what becomes of it.
func (s *Store) follow(ctx context.Context, w wireItem, redelivered bool, run Runner) outcome {
	rec, err := s.record(ctx, w.Job)
	if err != nil {
		if ctx.Err() != nil {
			return handedOn
		}
		return left // JetStream unreachable: the item comes back after ack_wait
	}
	if rec == nil || rec.finished() || w.Index >= rec.Total { // rule 2
		return settled
	}
	if s.holds(rec) { // rules 8 and 9
		return s.park(ctx, w)
	}
	if s.hasResult(ctx, w.Job, w.Index) { // rule 1
		return settled
	}
	fromCache := false
	it := Item{Job: rec, Index: w.Index, Path: w.Path, cached: &fromCache}
	it.Run, err = s.markRun(ctx, w.Job, w.Index) // rule 3
	if err != nil {
		if ctx.Err() != nil {
			return handedOn
		}
		return s.storeFailed(ctx, it, "run mark", err) // rule 7
	}
	if it.Run > 1 {
		redelivered = true
	}
	var body []byte
	var e *codec.Error
	if it.Run == 0 {
		e = codec.Errorf(codec.CodePoisonInput, "item %d (%s) was running twice when its gateway died; not run again", w.Index, w.Path)
	} else {
		body, e = s.run(ctx, it, run)
	}
	if s.stopped(w.Job) {
		return settled
	}
	if ctx.Err() != nil {
		if e != nil {
			// Interrupted by the gateway's stop: the run did not finish, so it gives its
			// mark back and the item goes to the next gateway now (not after ack_wait).
			s.unmarkRun(context.WithoutCancel(ctx), w.Job, w.Index, it.Run)
			return handedOn
		}
		// Done as the gateway stops: the result is kept, within a bound.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
	}
	if err := s.publishResult(ctx, it, body, e, redelivered); err != nil { // rule 6
		if ctx.Err() != nil {
			return left
		}
		return s.storeFailed(ctx, it, "result", err) // rule 7
	}
	return settled
}

// ack settles an item for good and counts it.
func (s *Store) ack(m jetstream.Msg) {
	if m.Ack() == nil {
		s.acked.Add(1)
	}
}

// keepAlive tells JetStream every third of ack_wait that m is in progress (rule 4), until
// stop is called (and has returned) or ctx ends.
func (s *Store) keepAlive(ctx context.Context, m jetstream.Msg) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.cfg.AckWait.D() / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				m.InProgress()
			}
		}
	}()
	return func() { cancel(); <-done }
}

// run runs an item, retrying errors that say nothing about the item (rule 5).
func (s *Store) run(ctx context.Context, it Item, run Runner) ([]byte, *codec.Error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.track(it, cancel)
	defer s.untrack(it)
	lost := 0
	wait := time.Second
	for {
		body, e := run(ctx, it)
		if e == nil || ctx.Err() != nil {
			return body, e
		}
		switch e.Code {
		case codec.CodeWorkerLost:
			if lost++; lost >= 2 {
				return nil, codec.Errorf(codec.CodePoisonInput, "two workers died holding this item (last: %s)", e.Message)
			}
		case codec.CodeNoWorker, codec.CodeOverloaded, codec.CodeUnavailable:
		default:
			return nil, e
		}
		s.log.Info("job item waits to be retried", "job", it.Job.Job, "item", it.Index, "code", e.Code, "after", wait)
		if !sleep(ctx, wait) {
			return nil, e
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// track and untrack keep the cancel of each item running here, for job.cancel.
func (s *Store) track(it Item, cancel context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[it.Job.Job] == nil {
		s.running[it.Job.Job] = map[int]context.CancelFunc{}
	}
	s.running[it.Job.Job][it.Index] = cancel
}

func (s *Store) untrack(it Item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running[it.Job.Job], it.Index)
	if len(s.running[it.Job.Job]) == 0 {
		delete(s.running, it.Job.Job)
	}
}

// stopped reports whether job is known here to be cancelled or failed.
func (s *Store) stopped(job string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.records[job]
	return r != nil && r.finished()
}

// hasResult reports whether item n of job has its result. An unreachable store counts as
// no: the worst case is one more run whose result is then refused as a second one.
func (s *Store) hasResult(ctx context.Context, job string, n int) bool {
	_, err := s.results.GetLastMsgForSubject(ctx, subjects.JobResult(job, n))
	return err == nil
}

// markRun takes item n's next run mark: 1 or 2, or 0 when both are taken. An error is
// the store's refusal (rule 7).
func (s *Store) markRun(ctx context.Context, job string, n int) (int, error) {
	for k := 1; k <= 2; k++ {
		err := s.write(ctx, nats.NewMsg(subjects.JobRun(job, n, k)))
		if err == nil {
			return k, nil
		}
		if !errors.Is(err, errTaken) {
			return 0, err
		}
	}
	return 0, nil
}

// unmarkRun gives back run mark k of item n (its run was stopped, not finished). Where
// that fails the mark stays taken: the item may then run once less, never once more.
func (s *Store) unmarkRun(ctx context.Context, job string, n, k int) {
	if k == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.results.Purge(ctx, jetstream.WithPurgeSubject(subjects.JobRun(job, n, k))); err != nil {
		s.log.Warn("give back a job item's run mark", "job", job, "item", n, "err", err)
	}
}

// publishResult records an item's one result (rule 6): a second one for the same item is
// refused by the stream, which is what the caller wants too. A result over the store's
// size limits is recorded as the error reply_too_large instead (rule 7: the work did
// run, and the item is answered, never dropped). Other refusals are write's.
func (s *Store) publishResult(ctx context.Context, it Item, body []byte, e *codec.Error, redelivered bool) error {
	msg, err := resultMsg(it, body, e, redelivered)
	if err != nil {
		return err
	}
	err = s.write(ctx, msg)
	var r *refusedError
	if errors.As(err, &r) && r.kind == msgTooLarge {
		tooLarge := codec.Errorf(codec.CodeReplyTooLarge, "the result is %d bytes, more than the job store takes: %v", len(msg.Data), r.err).
			With("bytes", len(msg.Data))
		if msg, err = resultMsg(it, nil, tooLarge, redelivered); err != nil {
			return err
		}
		err = s.write(ctx, msg)
	}
	if errors.Is(err, errTaken) {
		return nil
	}
	return err
}

// resultMsg is an item's result message.
func resultMsg(it Item, body []byte, e *codec.Error, redelivered bool) (*nats.Msg, error) {
	cached := it.cached != nil && *it.cached
	b, err := codec.Marshal(&storedResult{Index: it.Index, Path: it.Path, Result: body, Error: e, Cached: cached})
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subjects.JobResult(it.Job.Job, it.Index))
	msg.Data = b
	msg.Header.Set(HeaderOutcome, outcomeOK)
	if e != nil {
		msg.Header.Set(HeaderOutcome, string(e.Code))
	}
	if redelivered {
		msg.Header.Set(HeaderRedelivered, "1")
	}
	if cached {
		msg.Header.Set(HeaderCached, "1")
	}
	return msg, nil
}

// itemIndex reads n from a result subject ortbus.job.result.<job>.<n>.
func itemIndex(subject string) int {
	for i := len(subject) - 1; i >= 0; i-- {
		if subject[i] == '.' {
			n, err := strconv.Atoi(subject[i+1:])
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}
