package worker

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/models"
)

// decoder is the decode stage: it turns a job's input — the file paths and tensors its
// item names — into what its model's runtime call takes (models.Model.Prepare: an image
// decoded and preprocessed, tensors read), beside the inference. Its rules:
//
//  1. A job is decoded once: ahead, by one of the decoder's goroutines, or by the slot
//     that claims it (claim) when none has started it.
//  2. Threads: between start and stop the decoder runs `threads` goroutines (the pool's
//     decode_threads: config.Pool.DecodeWorkers), and no other.
//  3. Order: they decode the jobs the slots will take next, in the order the slots take
//     them (upcoming: the highest-priority class first, FIFO within it), looking at most
//     `bound` queued jobs ahead (slots × max_batch: the next unit of every slot, beyond
//     the ones running).
//  4. Bound: at most `bound` jobs are decoding or decoded ahead and not yet claimed by a
//     slot; a goroutine waits rather than go past it (memory: the decoded items held).
//  5. Dropped: a job whose context has ended (cancelled, answered, past its deadline) is
//     not decoded ahead; one decoded ahead whose context ends before a slot claims it is
//     dropped — its input released, its place under the bound freed — and a slot that
//     claims it then gets its context's error.
//  6. A panic in decoding is that job's internal error (counted by guard), never the
//     goroutine's or the slot's.
//  7. Waiting: the time slots spend in claim — decoding themselves, or waiting for a
//     goroutine's decode — is the time their model waited for input (waited; the
//     heartbeat's decode_wait_ms beside infer_ms).
//
// The queues tell the decoder when what they hold changes (wake); so does a job's
// context when it ends while the job is held ahead.
type decoder struct {
	log      *slog.Logger
	upcoming func(n int) []*job // the next n jobs the slots will take, in order (queues.upcoming)
	threads  int
	bound    int

	mu    sync.Mutex
	ahead map[*job]struct{} // decoding or decoded ahead, not claimed (rule 4)
	kick  chan struct{}     // capacity 1: something changed; a goroutine looks again
	quit  chan struct{}
	wg    sync.WaitGroup

	waited atomic.Int64 // nanoseconds the slots waited in claim (rule 7)
}

func newDecoder(log *slog.Logger, upcoming func(int) []*job, threads, bound int) *decoder {
	return &decoder{log: log, upcoming: upcoming, threads: max(0, threads), bound: max(1, bound),
		ahead: map[*job]struct{}{}, kick: make(chan struct{}, 1)}
}

// wake tells a decode goroutine to look again; it never blocks, so it may be called
// with any lock held.
func (d *decoder) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// start starts the decode goroutines (rule 2).
func (d *decoder) start() {
	d.quit = make(chan struct{})
	for range d.threads {
		d.wg.Add(1)
		go func() { defer d.wg.Done(); d.run() }()
	}
}

// stop ends the decode goroutines (each after its current decode) and waits for them.
func (d *decoder) stop() {
	if d.quit == nil {
		return
	}
	close(d.quit)
	d.wg.Wait()
	d.quit = nil
}

// run decodes ahead, one job at a time, until stop.
func (d *decoder) run() {
	for {
		if j := d.pick(); j != nil {
			d.wake() // another goroutine may find a job too
			d.decode(j)
			d.finish(j)
			continue
		}
		select {
		case <-d.kick:
		case <-d.quit:
			return
		}
	}
}

// pick drops the ended jobs held ahead (rule 5) and returns the next job to decode
// ahead, marked so, or nil: none within the bound (rules 3 and 4).
func (d *decoder) pick() *job {
	d.mu.Lock()
	defer d.mu.Unlock()
	for j := range d.ahead {
		if j.dec == decReady && j.ctx.Err() != nil {
			d.drop(j)
		}
	}
	if len(d.ahead) >= d.bound {
		return nil
	}
	for _, j := range d.upcoming(d.bound) {
		if j.dec != decNone || j.ctx == nil || j.ctx.Err() != nil {
			continue
		}
		j.dec, j.decoded = decAhead, make(chan struct{})
		d.ahead[j] = struct{}{}
		j.decUnwatch = context.AfterFunc(j.ctx, d.wake)
		return j
	}
	return nil
}

// finish marks j, decoded ahead, ready for its slot, or drops it when its context
// ended meanwhile (rule 5); a slot that claimed it meanwhile has it.
func (d *decoder) finish(j *job) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if j.dec != decAhead {
		return
	}
	j.dec = decReady
	if j.ctx.Err() != nil {
		d.drop(j)
	}
}

// drop releases j, held ahead, and its decoded input. Called with mu held.
func (d *decoder) drop(j *job) {
	d.release(j)
	j.dec, j.prepared, j.prepErr = decDropped, nil, nil
}

// release takes j out of the jobs held ahead. Called with mu held.
func (d *decoder) release(j *job) {
	if _, ok := d.ahead[j]; !ok {
		return
	}
	delete(d.ahead, j)
	if j.decUnwatch != nil {
		j.decUnwatch()
	}
	d.wake() // a place under the bound is free
}

// claim is the slot's side: it returns j's decoded input, decoding it now when no
// goroutine has started it, or waiting for the one that has (rules 1, 5 and 7). A job is
// claimed once, by the slot that runs it.
func (d *decoder) claim(j *job) (models.Item, error) {
	t0 := time.Now()
	defer func() { d.waited.Add(int64(time.Since(t0))) }()
	d.mu.Lock()
	state := j.dec
	switch state {
	case decDropped:
		d.mu.Unlock()
		return nil, ctxError(j.ctx, "before running")
	case decNone:
		j.decoded = make(chan struct{})
	}
	j.dec = decClaimed
	d.release(j)
	done := j.decoded
	d.mu.Unlock()
	if state == decNone {
		d.decode(j)
	}
	<-done
	return j.prepared, j.prepErr
}

// decode decodes j: its input, or its error (rule 6); decoded is closed after. Called
// on the goroutine that marked j (decAhead or decClaimed from decNone).
func (d *decoder) decode(j *job) {
	start := time.Now()
	defer close(j.decoded)
	defer func() { j.trace.step("ortbus.worker.decode", start, time.Now(), j.prepErr) }()
	defer guard.Recover(d.log, "prepare", func(e *codec.Error) { j.prepared, j.prepErr = nil, e })
	j.prepared, j.prepErr = j.model.Prepare(j.op, j.item)
}
