package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/telemetry"
	"github.com/ortbus/ortbus/telemetry/telemetrytest"
)

func attrsOf(s tracetest.SpanStub) map[string]string {
	out := map[string]string{}
	for _, a := range s.Attributes {
		out[string(a.Key)] = a.Value.Emit()
	}
	return out
}

// cpuConf is a configuration of one pool, cpu, on the device cuda:0.
func cpuConf() *config.Config {
	return &config.Config{Pools: map[string]*config.Pool{"cpu": {Name: "cpu", Device: "cuda:0"}}}
}

const (
	parentTP    = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	parentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
)

// A request's life as the hooks see it: accepted under the client's traceparent, sent,
// retried after its worker's death, sent again, answered. Its spans: the request span
// under the client's span; a queue and a send span per attempt under it; each send's
// context in its work item's headers; the first send ended at the retry, the second
// with the answer's code.
func TestTraceRequestLife(t *testing.T) {
	exp := telemetrytest.Record(t)
	parent := telemetry.Extract(context.Background(), nats.Header{telemetry.HeaderTraceparent: {parentTP}})
	p := &pending{id: "r1", op: "tag", class: "interactive", accepted: time.Now()}
	p.req.Model = "tagger"
	traceStart(parent, p)
	if p.trace == nil {
		t.Fatal("no spans started with tracing on")
	}
	m1 := &nats.Msg{Subject: "infer.cpu.interactive"}
	traceSend(p, effSend{p: p, pool: "cpu", attempt: 1}, cpuConf, m1)
	traceRequeued(p, "worker lost")
	m2 := &nats.Msg{Subject: "infer.cpu.interactive"}
	traceSend(p, effSend{p: p, pool: "cpu", target: "cpu-w2", attempt: 2}, cpuConf, m2)
	traceServed(p, codec.Served{Worker: "cpu-w2", EP: "cpu", Model: "tagger"})
	traceEnd(p, "cpu", codec.CodeDeadlineExceeded)

	var req tracetest.SpanStub
	var queues, sends []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		switch s.Name {
		case "ortbus.gateway.request":
			req = s
		case "ortbus.gateway.queue":
			queues = append(queues, s)
		case "ortbus.gateway.send":
			sends = append(sends, s)
		}
	}
	if req.SpanContext.TraceID().String() != parentTrace || req.Parent.SpanID().String() != "00f067aa0ba902b7" || req.SpanKind != trace.SpanKindServer {
		t.Fatalf("request span in trace %s under %s", req.SpanContext.TraceID(), req.Parent.SpanID())
	}
	a := attrsOf(req)
	for k, v := range map[string]string{"ortbus.op": "tag", "ortbus.class": "interactive", "ortbus.model": "tagger", "ortbus.pool": "cpu", "ortbus.device": "cuda:0", "ortbus.worker": "cpu-w2", "ortbus.ep": "cpu", "ortbus.request.id": "r1", "ortbus.error.code": "deadline_exceeded"} {
		if a[k] != v {
			t.Errorf("request span %s = %q, want %q", k, a[k], v)
		}
	}
	if len(queues) != 2 || len(sends) != 2 {
		t.Fatalf("%d queue and %d send spans, want 2 each", len(queues), len(sends))
	}
	for _, s := range append(queues, sends...) {
		if s.Parent.SpanID() != req.SpanContext.SpanID() {
			t.Errorf("%s is not the request span's child", s.Name)
		}
	}
	for i, m := range []*nats.Msg{m1, m2} {
		tp := m.Header.Get(telemetry.HeaderTraceparent)
		sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), m.Header))
		if telemetry.TraceID(tp) != parentTrace || sc.SpanID() != sends[i].SpanContext.SpanID() {
			t.Errorf("attempt %d's item carries %q, want the send span %s", i+1, tp, sends[i].SpanContext.SpanID())
		}
	}
	if !sends[0].EndTime.Before(sends[1].StartTime) && !sends[0].EndTime.Equal(sends[1].StartTime) {
		t.Error("the first attempt's span did not end at its retry")
	}
	if attrsOf(sends[1])["ortbus.error.code"] != "deadline_exceeded" || attrsOf(sends[1])["ortbus.worker"] != "cpu-w2" {
		t.Errorf("the last attempt's span: %v", attrsOf(sends[1]))
	}
	if _, ok := attrsOf(sends[0])["ortbus.error.code"]; ok {
		t.Error("the retried attempt's span has the answer's code")
	}
}

// A cache hit's request span says cached, with a lookup span under it.
func TestTraceCacheHit(t *testing.T) {
	exp := telemetrytest.Record(t)
	p := &pending{id: "r2", op: "tag", accepted: time.Now()}
	traceStart(context.Background(), p)
	traceLookup(p, time.Now(), true)
	traceEnd(p, "", "")
	spans := exp.GetSpans()
	if len(spans) != 2 || spans[0].Name != "ortbus.gateway.cache.lookup" || attrsOf(spans[1])["ortbus.cached"] != "true" || spans[1].Parent.IsValid() {
		t.Fatalf("spans %+v", spans)
	}
}

// Tracing off: no span, and the work item gets no headers.
func TestTraceOff(t *testing.T) {
	telemetry.Use(nil)
	parent := telemetry.Extract(context.Background(), nats.Header{telemetry.HeaderTraceparent: {parentTP}})
	p := &pending{id: "r3", op: "tag", accepted: time.Now()}
	traceStart(parent, p)
	m := &nats.Msg{Subject: "infer.cpu.interactive"}
	traceSend(p, effSend{p: p, pool: "cpu", attempt: 1}, cpuConf, m)
	traceRequeued(p, "worker lost")
	traceCancel(p)
	traceEnd(p, "cpu", "")
	if p.trace != nil || m.Header != nil {
		t.Fatalf("tracing off: trace %v, headers %v", p.trace, m.Header)
	}
}
