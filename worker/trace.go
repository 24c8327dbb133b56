package worker

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/telemetry"
)

// A work item's spans in this worker (package telemetry; nothing while tracing is off):
//
//	ortbus.worker.item      from its arrival to its answer, the child of the gateway's
//	                        send span whose trace context the item's headers carry (a
//	                        new trace when they carry none, or a malformed one)
//	  ortbus.worker.queue   its wait in the worker's class queue, until a slot took it
//	  ortbus.worker.decode  its input prepared (an image decoded, tensors read)
//	  ortbus.worker.infer   the runtime call of its unit (shared by a batch's items)
//	  ortbus.worker.encode  its reply encoded
//
// with the attributes op, model, class, pool, worker, ep, device, the request's id, and
// the error code of an error answer. A nil *jobTrace (tracing off) records nothing.

// jobTrace is a job's span and the context that carries it.
type jobTrace struct {
	ctx  context.Context
	span trace.Span
}

// startTrace starts the item span of a message that arrived at received, with the
// attributes class, pool, worker and device; nil while tracing is off.
func startTrace(h nats.Header, received time.Time, class, pool, worker, device string) *jobTrace {
	if !telemetry.Enabled() {
		return nil
	}
	ctx := telemetry.Extract(context.Background(), h)
	ctx, span := telemetry.Tracer().Start(ctx, "ortbus.worker.item", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(received),
		trace.WithAttributes(telemetry.AttrClass.String(class), telemetry.AttrPool.String(pool), telemetry.AttrWorker.String(worker), telemetry.AttrDevice.String(device)))
	return &jobTrace{ctx: ctx, span: span}
}

// item adds what the decoded item says to the span: op, model, id, attempt, ep.
func (t *jobTrace) item(op, model, id string, attempt int, ep string) {
	if t == nil {
		return
	}
	t.span.SetAttributes(telemetry.AttrOp.String(op), telemetry.AttrModel.String(model), telemetry.AttrID.String(id),
		telemetry.AttrAttempt.Int(attempt), telemetry.AttrEP.String(ep))
}

// step records a step (a child of the item span) from start to end.
func (t *jobTrace) step(name string, start, end time.Time, err error, attrs ...attribute.KeyValue) {
	if t == nil {
		return
	}
	_, span := telemetry.Tracer().Start(t.ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	telemetry.End(span, string(codec.CodeOf(err)), end)
}

// answer ends the item span with its answer's error code ("" for a result).
func (t *jobTrace) answer(code string) {
	if t == nil {
		return
	}
	telemetry.End(t.span, code, time.Time{})
}

// attrBatch is the infer step's attribute: the items of its unit.
func attrBatch(n int) attribute.KeyValue { return telemetry.AttrBatch.Int(n) }
