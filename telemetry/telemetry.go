// Package telemetry is ortbus's tracing: W3C trace context (`traceparent`,
// `tracestate`) taken from and put into NATS and HTTP headers, and the tracer the gateway
// and the workers start their spans with. It holds no exporter: package
// telemetry/export sets one up from the standard OTEL_* variables, and a process that
// never calls it (or whose environment names no exporter) traces nothing at no cost:
// Enabled is false, every hook returns at once, and no header is read or written.
//
// Trace context is input like any other. Its policy:
//
//  1. Only the first value of each header is read; a traceparent over MaxTraceparent
//     bytes is dropped unread (a new trace starts), a tracestate over MaxTracestate bytes
//     is dropped alone (the traceparent still counts): the headers are bounded before
//     they are parsed, as a message's body is before it is decoded (codec/bound.go).
//  2. A malformed traceparent is ignored: the request runs as any other, under a new
//     trace. It is never an error, never a reply's code, never logged per request.
//  3. A malformed tracestate is dropped (W3C: it must not affect the traceparent).
package telemetry

import (
	"context"
	"crypto/rand"
	"net/http"
	"sync/atomic"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The W3C trace context headers, as ortbus writes them (lowercase, as the W3C spells
// them; NATS headers are case-sensitive, so the canonical HTTP spelling is read too).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// The bounds of rule 1. A version-00 traceparent is exactly 55 bytes; later versions may
// append fields, so a little more is read. W3C asks that at least 512 bytes of
// tracestate be propagated: what is longer is dropped rather than cut.
const (
	MaxTraceparent = 256
	MaxTracestate  = 512
)

// TracerName names ortbus's instrumentation scope in the spans it exports.
const TracerName = "github.com/ortbus/ortbus"

var (
	enabled atomic.Bool
	tracer  atomic.Pointer[trace.Tracer]
	prop    = propagation.TraceContext{}
)

// Use makes tp the source of this process's spans and turns tracing on (Enabled); nil
// turns it off again. telemetry/export calls it; tests may too.
func Use(tp trace.TracerProvider) {
	if tp == nil {
		enabled.Store(false)
		tracer.Store(nil)
		return
	}
	t := tp.Tracer(TracerName)
	tracer.Store(&t)
	enabled.Store(true)
}

// Enabled reports whether this process traces (Use was given a provider).
func Enabled() bool { return enabled.Load() }

// Tracer is the tracer of this process's spans: a no-op one while tracing is off.
func Tracer() trace.Tracer {
	if t := tracer.Load(); t != nil {
		return *t
	}
	return noop.NewTracerProvider().Tracer(TracerName)
}

// boundedCarrier reads the trace headers of one message under rule 1 and writes them
// into it (Inject).
type boundedCarrier map[string][]string

func (c boundedCarrier) Get(key string) string {
	v := first(c, key)
	if v == "" {
		v = first(c, http.CanonicalHeaderKey(key))
	}
	switch {
	case key == HeaderTraceparent && len(v) > MaxTraceparent:
		return ""
	case key == HeaderTracestate && len(v) > MaxTracestate:
		return ""
	}
	return v
}

func first(h map[string][]string, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c boundedCarrier) Set(key, value string) { c[key] = []string{value} }

func (c boundedCarrier) Keys() []string { return []string{HeaderTraceparent, HeaderTracestate} }

// Extract returns ctx carrying the remote span context of the message headers h (a
// nats.Header or micro.Headers), under the policy above; ctx itself when tracing is off
// or h carries none that is valid.
func Extract(ctx context.Context, h map[string][]string) context.Context {
	if !Enabled() || h == nil {
		return ctx
	}
	return prop.Extract(ctx, boundedCarrier(h))
}

// ExtractHTTP is Extract for HTTP request headers.
func ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	return Extract(ctx, h)
}

// Inject writes the span context of ctx into the message headers h (which must not be
// nil); nothing when ctx carries no valid one.
func Inject(ctx context.Context, h map[string][]string) {
	prop.Inject(ctx, boundedCarrier(h))
}

// TraceID is the trace id of a traceparent header value as the gateway reads it (rule
// 1), "" when it is malformed.
func TraceID(traceparent string) string {
	sc := trace.SpanContextFromContext(prop.Extract(context.Background(), boundedCarrier{HeaderTraceparent: {traceparent}}))
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// NewTraceparent is a fresh traceparent, sampled, with random trace and span ids, and
// its trace id: for a caller that starts a trace of its own (`ortbus req -trace`).
func NewTraceparent() (header, traceID string) {
	var b [24]byte
	for {
		rand.Read(b[:]) // never fails (crypto/rand)
		var scc trace.SpanContextConfig
		copy(scc.TraceID[:], b[:16])
		copy(scc.SpanID[:], b[16:])
		scc.TraceFlags = trace.FlagsSampled
		sc := trace.NewSpanContext(scc)
		if !sc.IsValid() {
			continue // an all-zero id: vanishingly rare
		}
		h := boundedCarrier{}
		prop.Inject(trace.ContextWithSpanContext(context.Background(), sc), h)
		return h.Get(HeaderTraceparent), sc.TraceID().String()
	}
}
