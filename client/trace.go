package client

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/ortbus/ortbus/telemetry"
)

// Trace context: every call carries the W3C trace context of its ctx in the headers
// traceparent and tracestate, so that an app's trace goes on through ortbus (the
// gateway's and the workers' spans, when they export them, are the children of the
// caller's span). It is the explicit traceparent of WithTraceparent when ctx has one,
// else the span context of ctx's active OpenTelemetry span; none when ctx has neither.
// The client only propagates: it starts no span and needs no SDK.

type traceparentKey struct{}

// explicitTrace is a traceparent (and tracestate) given with WithTraceparent.
type explicitTrace struct{ parent, state string }

// WithTraceparent returns ctx whose calls carry traceparent (and tracestate, when not
// "") as given, in place of ctx's active span. A malformed one is sent all the same and
// ignored by the gateway (a new trace starts there).
func WithTraceparent(ctx context.Context, traceparent, tracestate string) context.Context {
	return context.WithValue(ctx, traceparentKey{}, explicitTrace{traceparent, tracestate})
}

// setTrace writes the trace context of ctx into m's headers (made when it has none and
// ctx has a trace context: a call without one sends no header).
func setTrace(ctx context.Context, m *nats.Msg) {
	t, explicit := ctx.Value(traceparentKey{}).(explicitTrace)
	if !explicit && !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	if !explicit {
		telemetry.Inject(ctx, m.Header)
		return
	}
	m.Header.Set(telemetry.HeaderTraceparent, t.parent)
	if t.state != "" {
		m.Header.Set(telemetry.HeaderTracestate, t.state)
	}
}
