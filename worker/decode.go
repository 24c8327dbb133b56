package worker

import (
	"log/slog"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/models"
)

// decoder is the decode stage: it turns a job's input — the file paths and tensors its
// item names — into what its model's runtime call takes (models.Model.Prepare: an image
// decoded and preprocessed, tensors read). Its rules:
//
//  1. A job is decoded once (job.prep): by the slot that runs it, or ahead of it.
//  2. Ahead: while a slot's unit runs (the runtime call releases the Go processor), the
//     job a slot takes next is decoded on a goroutine of its own, so that its runtime
//     call can follow at once. One job ahead, once; a job cancelled meanwhile wastes only
//     its decoding.
//  3. A panic in decoding is that job's internal error (counted by guard), never the
//     slot's.
//
// Today it decodes on the slot's goroutine and one goroutine ahead; it is its own stage
// so that it can run beside inference with threads of its own.
type decoder struct {
	log *slog.Logger
}

func newDecoder(log *slog.Logger) *decoder { return &decoder{log: log} }

// prepare returns j's decoded input, decoding it on the first call (rules 1 and 3).
func (d *decoder) prepare(j *job) (models.Item, error) {
	j.prep.Do(func() {
		start := time.Now()
		defer func() { j.trace.step("ortbus.worker.decode", start, time.Now(), j.prepErr) }()
		defer guard.Recover(d.log, "prepare", func(e *codec.Error) { j.prepErr = e })
		j.prepared, j.prepErr = j.model.Prepare(j.op, j.item)
	})
	return j.prepared, j.prepErr
}

// ahead starts decoding j, the job a slot takes next (nil: none), unless it is done,
// cancelled or already started (rule 2).
func (d *decoder) ahead(j *job) {
	if j == nil || j.ctx.Err() != nil || j.ahead.Swap(true) {
		return
	}
	go d.prepare(j)
}
