package telemetry

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The attributes of ortbus's spans: what users filter on. Every value is a configured
// name (op, class, pool, model, device), an id ortbus checked (request, job, worker), a
// stable error code, or a number: never free text from the wire.
const (
	AttrOp      = attribute.Key("ortbus.op")
	AttrClass   = attribute.Key("ortbus.class")
	AttrModel   = attribute.Key("ortbus.model")
	AttrPool    = attribute.Key("ortbus.pool")
	AttrWorker  = attribute.Key("ortbus.worker")
	AttrEP      = attribute.Key("ortbus.ep")
	AttrDevice  = attribute.Key("ortbus.device")
	AttrCached  = attribute.Key("ortbus.cached")
	AttrCode    = attribute.Key("ortbus.error.code")
	AttrID      = attribute.Key("ortbus.request.id")
	AttrJob     = attribute.Key("ortbus.job")
	AttrAttempt = attribute.Key("ortbus.attempt")
	AttrBatch   = attribute.Key("ortbus.batch")
	AttrDirect  = attribute.Key("ortbus.reply_direct")
)

// End ends span at now (the zero time: the clock's now), marked with the error code
// code when it is not "" (a result: no status set).
func End(span trace.Span, code string, at time.Time) {
	if code != "" {
		span.SetAttributes(AttrCode.String(code), attribute.String("error.type", code))
		span.SetStatus(codes.Error, code)
	}
	if at.IsZero() {
		span.End()
		return
	}
	span.End(trace.WithTimestamp(at))
}
