package worker

import (
	"context"
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
	// answered is set by the job's one terminal answer; later answers are ignored.
	answered atomic.Bool
	// trace: its spans (trace.go), nil while tracing is off; set at its arrival.
	trace *jobTrace
}
