package test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/telemetry"
)

// Tracing end to end: a real gateway and its real worker export their spans over
// OTLP/HTTP to a real receiver the test runs (otlp_helpers_test.go), as the standard
// OTEL_* variables tell them.

const (
	traceGiven  = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentGiven = "00f067aa0ba902b7"
)

// TestTraceEndToEnd: a request sent with `traceparent: 00-<trace>-<span>-01` yields the
// gateway's spans and the worker's under <trace>, parented correctly: the gateway's
// request span under <span>, its send span under the request span, the worker's item
// span under the send span, and its steps under the item span. So does one sent over
// HTTP. A malformed and a 4 KiB traceparent each get a normal reply, under a new trace.
func TestTraceEndToEnd(t *testing.T) {
	rcv := startOTLPReceiver(t)
	root := imageRoot(t)
	img := colourPNG(t, root, "red")
	cfg := gwConfig{
		Root:    root,
		Pools:   []gwPool{{Name: "cpu", Version: "1.24.3", Workers: 1, Slots: 1, Classes: []string{"interactive"}, Models: []string{gwTagger}}},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"cpu"}}},
	}.write(t)
	// The gateway's environment; its local workers inherit it.
	g := launchGateway(t, cfg, true, "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_BSP_SCHEDULE_DELAY=20", "OTEL_TRACES_SAMPLER=parentbased_always_on", "OTEL_SERVICE_NAME=", "OTEL_TRACES_EXPORTER=")

	tag := func(id, traceparent string) {
		t.Helper()
		b, _ := codec.Marshal(&codec.Request{ID: id, Path: img, Model: gwTagger})
		m := nats.NewMsg("ortbus.v1.tag")
		m.Data = b
		if traceparent != "" {
			m.Header.Set(telemetry.HeaderTraceparent, traceparent)
		}
		rep, err := g.NC.RequestMsg(m, gwReplyBound)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		checkColourTag(t, gwDecode(t, rep).tag(t), "red")
	}
	tag("tr-given", "00-"+traceGiven+"-"+parentGiven+"-01")
	spans := rcv.await(t, gwReplyBound, "the spans of tr-given", func(ss []otlpSpan) bool { return traceComplete(ss, traceGiven) })
	checkTraceTree(t, spans, traceGiven, parentGiven, "tr-given")

	// Over HTTP, the header of the HTTP request.
	httpTrace, httpParent := "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.Ready.HTTP+"/v1/tag", strings.NewReader(`{"id":"tr-http","path":"`+img+`","model":"`+gwTagger+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+httpTrace+"-"+httpParent+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP tag: %s", resp.Status)
	}
	spans = rcv.await(t, gwReplyBound, "the spans of tr-http", func(ss []otlpSpan) bool { return traceComplete(ss, httpTrace) })
	checkTraceTree(t, spans, httpTrace, httpParent, "tr-http")

	// Hostile traceparents change nothing but the trace id.
	hostile := map[string]string{
		"tr-malformed": "00-" + strings.ToUpper(traceGiven) + "-zz-01",
		"tr-4k":        "00-" + traceGiven + "-" + parentGiven + "-01-" + strings.Repeat("f", 4096),
	}
	for id, tp := range hostile {
		tag(id, tp)
	}
	spans = rcv.await(t, gwReplyBound, "the request spans of the hostile traceparents", func(ss []otlpSpan) bool {
		n := 0
		for _, s := range ss {
			if hostile[s.Attr("ortbus.request.id")] != "" && s.Span.Name == "ortbus.gateway.request" {
				n++
			}
		}
		return n == len(hostile)
	})
	for _, s := range spans {
		if s.Span.Name != "ortbus.gateway.request" || hostile[s.Attr("ortbus.request.id")] == "" {
			continue
		}
		if s.TraceID() == traceGiven || len(s.Span.ParentSpanId) != 0 || s.Attr("ortbus.error.code") != "" {
			t.Errorf("%s: request span in trace %s under %q (code %q), want a new trace's root answered ok", s.Attr("ortbus.request.id"), s.TraceID(), s.Parent(), s.Attr("ortbus.error.code"))
		}
	}
}

// traceComplete reports whether spans hold every span of one request in trace: the
// gateway's and the worker's (each process exports its own batches, in its own time).
func traceComplete(spans []otlpSpan, trace string) bool {
	want := map[string]bool{}
	for _, n := range []string{"gateway.request", "gateway.queue", "gateway.send", "worker.item", "worker.queue", "worker.decode", "worker.infer", "worker.encode"} {
		want["ortbus."+n] = true
	}
	for _, s := range spans {
		if s.TraceID() == trace {
			delete(want, s.Span.Name)
		}
	}
	return len(want) == 0
}

// checkTraceTree checks the spans of request id in trace, sent under parent: the
// gateway's request span under parent with its attributes, a queue and a send span
// under it, the worker's item span under the send span, its steps under the item span.
func checkTraceTree(t *testing.T, spans []otlpSpan, trace, parent, id string) {
	t.Helper()
	byName := map[string]otlpSpan{}
	for _, s := range spans {
		if s.TraceID() == trace {
			byName[s.Service+" "+s.Span.Name] = s
		}
	}
	req, ok := byName["ortbus-gateway ortbus.gateway.request"]
	if !ok {
		t.Fatalf("%s: no gateway request span in trace %s (spans: %v)", id, trace, names(byName))
	}
	if req.Parent() != parent {
		t.Errorf("%s: the request span's parent is %q, want the caller's %s", id, req.Parent(), parent)
	}
	for k, v := range map[string]string{"ortbus.op": "tag", "ortbus.class": "interactive", "ortbus.pool": "cpu", "ortbus.request.id": id, "ortbus.model": gwTagger} {
		if got := req.Attr(k); got != v {
			t.Errorf("%s: request span %s = %q, want %q", id, k, got, v)
		}
	}
	if req.Attr("ortbus.worker") == "" {
		t.Errorf("%s: the request span names no worker", id)
	}
	send := byName["ortbus-gateway ortbus.gateway.send"]
	for _, name := range []string{"ortbus-gateway ortbus.gateway.queue", "ortbus-gateway ortbus.gateway.send"} {
		if s, ok := byName[name]; !ok || s.Parent() != req.SpanID() {
			t.Errorf("%s: %s found %v, parent %q, want the request span %s", id, name, ok, s.Parent(), req.SpanID())
		}
	}
	item, ok := byName["ortbus-worker ortbus.worker.item"]
	if !ok || item.Parent() != send.SpanID() {
		t.Fatalf("%s: worker item span found %v under %q, want the send span %s (spans: %v)", id, ok, item.Parent(), send.SpanID(), names(byName))
	}
	for k, v := range map[string]string{"ortbus.op": "tag", "ortbus.model": gwTagger, "ortbus.pool": "cpu", "ortbus.worker": req.Attr("ortbus.worker"), "ortbus.ep": "cpu"} {
		if got := item.Attr(k); got != v {
			t.Errorf("%s: item span %s = %q, want %q", id, k, got, v)
		}
	}
	for _, step := range []string{"queue", "decode", "infer", "encode"} {
		if s, ok := byName["ortbus-worker ortbus.worker."+step]; !ok || s.Parent() != item.SpanID() {
			t.Errorf("%s: worker %s span found %v, parent %q, want the item span %s", id, step, ok, s.Parent(), item.SpanID())
		}
	}
	// Ordering, not a latency bound: the worker took the item after the gateway sent it.
	if item.Span.StartTimeUnixNano < send.Span.StartTimeUnixNano {
		t.Errorf("%s: the worker's item span starts before the gateway's send", id)
	}
}

func names(m map[string]otlpSpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
