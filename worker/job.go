package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models"
)

// job is one work item between arrival and reply: made by the serving side's accept,
// queued (queues), decoded (decoder), run by a slot (slots) and answered once (replier).
type job struct {
	msg      *nats.Msg
	item     *codec.WorkItem
	claim    string // the subject of its claims ("" when the item asked for none)
	op       string
	class    string
	model    models.Model
	asJSON   bool
	received time.Time
	deadline time.Time
	ctx      context.Context
	cancel   context.CancelFunc
	// The prepared input (decoded image, read tensors), made once by the decode stage
	// (decode.go): ahead of its slot, beside the inference, or by the slot itself. dec,
	// decoded and decUnwatch are the decoder's (its lock); prepared and prepErr are set
	// before decoded is closed.
	dec        decState
	decoded    chan struct{}
	decUnwatch func() bool
	prepared   models.Item
	prepErr    error
	// verdict is its wait for the gateway's verdict (verdict.go): set for an item with
	// reply_direct and a claim subject, before its claim is sent; nil for the others.
	verdict *verdictWait
	// answered is set by the job's one terminal answer; later answers are ignored.
	answered atomic.Bool
	// trace: its spans (trace.go), nil while tracing is off; set at its arrival.
	trace *jobTrace
}

// decState is where a job is in the decode stage (decode.go; job.dec, guarded by the
// decoder's lock); the rules named are the decoder's.
type decState uint8

const (
	decNone    decState = iota // not started
	decAhead                   // a decode goroutine decodes it (rule 3)
	decReady                   // decoded ahead, waiting for its slot
	decClaimed                 // claimed by its slot: decoded, or being decoded
	decDropped                 // its context ended before a slot claimed it (rule 5)
)

// ctxError is the answer of a job whose context ended (cancelled, or past its deadline)
// when (before or while running).
func ctxError(ctx context.Context, when string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return codec.Errorf(codec.CodeDeadlineExceeded, "deadline passed %s", when)
	}
	return codec.Errorf(codec.CodeCancelled, "request cancelled %s", when)
}
