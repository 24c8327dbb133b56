package worker

import (
	"context"
	"time"

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
// the error code of an error answer.

// jobTrace is a job's span and the context that carries it.
type jobTrace struct {
	ctx  context.Context
	span trace.Span
}

// traceAccept starts j's item span at its arrival.
func (w *Worker) traceAccept(j *job) {
	if !telemetry.Enabled() {
		return
	}
	ctx := telemetry.Extract(context.Background(), j.msg.Header)
	ctx, span := telemetry.Tracer().Start(ctx, "ortbus.worker.item", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(j.received),
		trace.WithAttributes(telemetry.AttrClass.String(j.class), telemetry.AttrPool.String(w.pool.Name), telemetry.AttrWorker.String(w.id), telemetry.AttrDevice.String(w.pool.Device)))
	j.trace = &jobTrace{ctx: ctx, span: span}
}

// traceItem adds what the decoded item says to j's span: op, model, id, attempt.
func (w *Worker) traceItem(j *job) {
	if j.trace == nil {
		return
	}
	j.trace.span.SetAttributes(telemetry.AttrOp.String(j.op), telemetry.AttrModel.String(j.model.Name()), telemetry.AttrID.String(j.item.ID),
		telemetry.AttrAttempt.Int(j.item.Attempt), telemetry.AttrEP.String(w.EP()))
}

// traceStep records a step of j (a child of its item span) from start to end.
func (j *job) traceStep(name string, start, end time.Time, err error, attrs ...attribute.KeyValue) {
	if j.trace == nil {
		return
	}
	_, span := telemetry.Tracer().Start(j.trace.ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	telemetry.End(span, string(codec.CodeOf(err)), end)
}

// traceInfer records the runtime call of a unit, from start to end, in each of its jobs.
func traceInfer(unit []*job, start, end time.Time, errs []error) {
	for i, j := range unit {
		if j.trace == nil {
			continue
		}
		var err error
		if i < len(errs) {
			err = errs[i]
		}
		j.traceStep("ortbus.worker.infer", start, end, err, telemetry.AttrBatch.Int(len(unit)))
	}
}

// traceAnswer ends j's item span with its answer's error code ("" for a result).
func (j *job) traceAnswer(code string) {
	if j.trace == nil {
		return
	}
	telemetry.End(j.trace.span, code, time.Time{})
}
