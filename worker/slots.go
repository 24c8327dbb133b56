package worker

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/fault"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/models"
)

// slots are the worker's slots: goroutines that each take a unit of work from the local
// queues (queues: their priority, bounds and batching), have its jobs decoded (decoder),
// run them as one runtime call and answer each (replier). Their rules:
//
//  1. A job past its deadline or cancelled before its unit runs is answered so, not run;
//     one that fails to decode is answered its error; the others run together.
//  2. The runtime call's context is cancelled only when every job of the unit is; a job
//     cancelled or late while it ran is answered so, its result discarded.
//  3. A panic in a unit answers each of its jobs not yet answered internal; the slot
//     goes on.
//  4. The slots end once the queues are closed and empty (wait); the decode stage runs
//     from their start to their end.
//  5. The time of each runtime call is counted (inferred: the heartbeat's infer_ms),
//     beside the time the slots waited for its inputs (the decoder's).
//  6. A run error that says the webgpu device is lost is a lost adapter (adapterlost.go):
//     the job is answered provider_unavailable, and every model fails.
type slots struct {
	n        int
	q        *queues
	decode   *decoder
	reply    *replier
	log      *slog.Logger
	wg       sync.WaitGroup
	inferred atomic.Int64 // nanoseconds in runtime calls (rule 5)
	// watch sees the runs' errors for a lost adapter (rule 6; nil: none is watched).
	watch *adapterWatch
}

func newSlots(n int, q *queues, d *decoder, r *replier, log *slog.Logger) *slots {
	return &slots{n: n, q: q, decode: d, reply: r, log: log}
}

// start starts the decode stage and the slots.
func (s *slots) start() {
	s.decode.start()
	for range s.n {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.slot() }()
	}
}

// wait waits until the slots ended, then ends the decode stage (rule 4).
func (s *slots) wait() {
	s.wg.Wait()
	s.decode.stop()
}

// slot runs units of work until the queues close.
func (s *slots) slot() {
	for {
		unit := s.q.take()
		if unit == nil {
			return
		}
		s.runGuarded(unit)
		s.q.done(unit)
	}
}

// runGuarded runs a unit (rule 3).
func (s *slots) runGuarded(unit []*job) {
	defer guard.Recover(s.log, "unit of work", func(e *codec.Error) {
		for _, j := range unit {
			s.reply.answer(j, nil, e)
		}
	})
	s.runUnit(unit)
}

// runUnit decodes each job (rule 1), runs the ready ones as one runtime call (rule 2),
// and answers each exactly once.
func (s *slots) runUnit(unit []*job) {
	taken := time.Now()
	ready := unit[:0:0]
	for _, j := range unit {
		j.trace.step("ortbus.worker.queue", j.received, taken, nil)
		if err := j.ctx.Err(); err != nil {
			s.reply.answer(j, nil, ctxError(j.ctx, "before running"))
			continue
		}
		fault.Check(j.item.Path)
		if _, err := s.decode.claim(j); err != nil {
			s.reply.answer(j, nil, err)
			continue
		}
		ready = append(ready, j)
	}
	if len(ready) == 0 {
		return
	}
	items := make([]models.Item, len(ready))
	for i, j := range ready {
		items[i] = j.prepared
	}
	ctx, stop := unitContext(ready)
	defer stop()
	t0 := time.Now()
	replies, errs := s.run(ctx, ready, items)
	t1 := time.Now()
	s.inferred.Add(int64(t1.Sub(t0)))
	inferUS := t1.Sub(t0).Microseconds()
	for i, j := range ready {
		err := errs[i]
		j.trace.step("ortbus.worker.infer", t0, t1, err, attrBatch(len(ready)))
		if j.ctx.Err() != nil {
			err = ctxError(j.ctx, "while running") // rule 2: a result, if any, is discarded
		}
		if rep := replies[i]; rep != nil {
			m := rep.Meta()
			m.Timing = timing(j, taken, inferUS)
			m.Timing.Batch = len(ready)
		}
		if s.watch != nil && err != nil {
			err = s.watch.check(s.watch.models.execProvider(), err) // rule 6
		}
		s.reply.answer(j, replies[i], err)
	}
}

// run is the unit's one runtime call; a unit the fault hook asks to fail as on a lost
// device (tests only: adapterlost.go, rule 3) fails so, without it.
func (s *slots) run(ctx context.Context, ready []*job, items []models.Item) ([]codec.Replier, []error) {
	for _, j := range ready {
		if err := injected(j.item); err != nil {
			errs := make([]error, len(ready))
			for i := range errs {
				errs[i] = err
			}
			return make([]codec.Replier, len(ready)), errs
		}
	}
	return ready[0].model.Run(ctx, ready[0].op, items)
}

// unitContext is done when every job's context is done (rule 2).
func unitContext(unit []*job) (context.Context, func()) {
	if len(unit) == 1 {
		return unit[0].ctx, func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for _, j := range unit {
			select {
			case <-j.ctx.Done():
			case <-ctx.Done():
				return
			}
		}
		cancel()
	}()
	return ctx, cancel
}

// timing: queue_us is the wait until a slot took the item (in the gateway and in the
// worker), infer_us the runtime call, total_us everything since the gateway accepted it.
func timing(j *job, start time.Time, inferUS int64) codec.Timing {
	since := j.received
	if j.item.EnqueuedUnixUS > 0 {
		since = time.UnixMicro(j.item.EnqueuedUnixUS)
	}
	return codec.Timing{QueueUS: max(0, start.Sub(since).Microseconds()), InferUS: inferUS, TotalUS: max(0, time.Since(since).Microseconds())}
}
