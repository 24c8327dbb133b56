package gateway

import (
	"cmp"
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/telemetry"
)

// A request's spans in this gateway (package telemetry; nothing while tracing is off):
//
//	ortbus.gateway.request         from its acceptance to its one terminal answer: the
//	                               child of the client's span when its headers (NATS or
//	                               HTTP) carry a valid traceparent, else a new trace's
//	                               root; a job item's is a root of its own (ortbus.job)
//	  ortbus.gateway.cache.lookup  its lookup in the result cache (ortbus.cached: a hit)
//	  ortbus.gateway.queue         each wait in its class queue, until an attempt is sent
//	  ortbus.gateway.send          each attempt, from its send to its end (an answer, a
//	                               retry after a worker's death, a redispatch of an
//	                               unclaimed one): its context travels in the work item's
//	                               headers, so the worker's spans are its children
//
// and on the request span an event per cancel asked, the attributes op, class, model,
// pool, worker, ep, device, cached, the request's id, and the error code of an error
// answer. The hooks below are the only tracing calls in the gateway; each returns at
// once for a request without spans (p.trace nil).

// traceStart starts p's request span at its acceptance, under the trace context of
// parent (what its headers carried: telemetry.Extract).
func traceStart(parent context.Context, p *pending, attrs ...attribute.KeyValue) {
	if !telemetry.Enabled() {
		return
	}
	attrs = append(attrs, telemetry.AttrOp.String(p.op))
	ctx, span := telemetry.Tracer().Start(parent, "ortbus.gateway.request", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(p.accepted), trace.WithAttributes(attrs...))
	p.trace = &reqTrace{ctx: ctx, span: span, queued: p.accepted}
}

// traceLookup records p's lookup in the result cache, from start to now.
func traceLookup(p *pending, start time.Time, hit bool) {
	t := p.trace
	if t == nil {
		return
	}
	_, span := telemetry.Tracer().Start(t.ctx, "ortbus.gateway.cache.lookup", trace.WithTimestamp(start), trace.WithAttributes(telemetry.AttrCached.Bool(hit)))
	span.End()
	if hit {
		t.span.SetAttributes(telemetry.AttrCached.Bool(true))
	}
}

// traceSend records p's wait in its queue and starts the span of attempt e, whose
// trace context goes into msg's headers for the worker; conf is the configuration in
// force (the pool's device).
func traceSend(p *pending, e effSend, conf func() *config.Config, msg *nats.Msg) {
	t := p.trace
	if t == nil {
		return
	}
	now := time.Now()
	device := conf().Pool(e.pool).Device
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.send != nil {
		// Its last attempt found no subscriber and waited out its backoff (L5).
		t.send.AddEvent("superseded", trace.WithTimestamp(now))
		t.send.End(trace.WithTimestamp(now))
		t.queued = now
	}
	_, q := telemetry.Tracer().Start(t.ctx, "ortbus.gateway.queue", trace.WithTimestamp(t.queued), trace.WithAttributes(telemetry.AttrClass.String(p.class)))
	q.End(trace.WithTimestamp(now))
	attrs := []attribute.KeyValue{telemetry.AttrPool.String(e.pool), telemetry.AttrDevice.String(device), telemetry.AttrAttempt.Int(e.attempt), telemetry.AttrDirect.Bool(e.direct)}
	if e.target != "" {
		attrs = append(attrs, telemetry.AttrWorker.String(e.target))
	}
	ctx, span := telemetry.Tracer().Start(t.ctx, "ortbus.gateway.send", trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(now), trace.WithAttributes(attrs...))
	t.send, t.device = span, device
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	telemetry.Inject(ctx, msg.Header)
}

// traceRequeued ends p's attempt, which did not answer it (why: its worker died, or no
// worker claimed it): p waits in its queue again from now.
func traceRequeued(p *pending, why string) {
	t := p.trace
	if t == nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.send != nil {
		t.send.AddEvent(why, trace.WithTimestamp(now))
		t.send.End(trace.WithTimestamp(now))
		t.send = nil
	}
	t.queued = now
	t.span.AddEvent(why, trace.WithTimestamp(now))
}

// traceCancel marks the cancel of p, asked while it is at a worker.
func traceCancel(p *pending) {
	if t := p.trace; t != nil {
		t.span.AddEvent("cancel")
	}
}

// traceServed records who answered p: the worker (and, from a relayed reply, its ep and
// model).
func traceServed(p *pending, s codec.Served) {
	t := p.trace
	if t == nil {
		return
	}
	attrs := []attribute.KeyValue{telemetry.AttrWorker.String(s.Worker)}
	if s.EP != "" {
		attrs = append(attrs, telemetry.AttrEP.String(s.EP))
	}
	if s.Model != "" {
		attrs = append(attrs, telemetry.AttrModel.String(s.Model))
	}
	t.span.SetAttributes(attrs...)
}

// traceEnd ends p's spans with its terminal answer from pool ("" if none), code ""
// for a result.
func traceEnd(p *pending, pool string, code codec.Code) {
	t := p.trace
	if t == nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	if t.send != nil {
		telemetry.End(t.send, string(code), now)
		t.send = nil
	}
	device := t.device
	t.mu.Unlock()
	attrs := []attribute.KeyValue{telemetry.AttrID.String(cmp.Or(p.clientID, p.id, p.req.ID))}
	if p.class != "" {
		attrs = append(attrs, telemetry.AttrClass.String(p.class))
	}
	if p.req.Model != "" {
		attrs = append(attrs, telemetry.AttrModel.String(p.req.Model))
	}
	if pool != "" {
		attrs = append(attrs, telemetry.AttrPool.String(pool), telemetry.AttrDevice.String(device))
	}
	t.span.SetAttributes(attrs...)
	telemetry.End(t.span, string(code), now)
}
