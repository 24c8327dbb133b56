package telemetry

import (
	"context"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

const (
	validTP  = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	validTID = "4bf92f3577b34da6a3ce929d0e0e4736"
)

// on turns tracing on for one test with an SDK provider that exports nowhere.
func on(t *testing.T) {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	Use(tp)
	t.Cleanup(func() { Use(nil); tp.Shutdown(context.Background()) })
}

func remote(ctx context.Context) trace.SpanContext { return trace.SpanContextFromContext(ctx) }

func TestExtractValid(t *testing.T) {
	on(t)
	sc := remote(Extract(context.Background(), map[string][]string{HeaderTraceparent: {validTP}, HeaderTracestate: {"a=1,b=2"}}))
	if !sc.IsValid() || !sc.IsRemote() || sc.TraceID().String() != validTID || sc.SpanID().String() != "00f067aa0ba902b7" || !sc.IsSampled() {
		t.Fatalf("extracted %+v", sc)
	}
	if got := sc.TraceState().String(); got != "a=1,b=2" {
		t.Fatalf("tracestate %q", got)
	}
	// HTTP headers are canonicalised: Traceparent.
	h := http.Header{}
	h.Set(HeaderTraceparent, validTP)
	if sc := remote(ExtractHTTP(context.Background(), h)); sc.TraceID().String() != validTID {
		t.Fatalf("from HTTP headers: %+v", sc)
	}
}

// Rules 1-3: what is malformed or too long is ignored, and never panics.
func TestExtractHostile(t *testing.T) {
	on(t)
	for name, tp := range map[string]string{
		"empty":         "",
		"garbage":       "not a traceparent",
		"zero trace":    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"zero span":     "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"upper hex":     "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
		"version ff":    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"short":         validTP[:54],
		"v00 with more": validTP + "-00",
		"4 KiB":         validTP + "-" + strings.Repeat("a", 4096),
		"4 KiB v01":     "01" + validTP[2:] + "-" + strings.Repeat("a", 4096),
		"non utf8":      "00-4bf92f3577b34da6a3ce929d0e0e47\xff\xfe-00f067aa0ba902b7-01",
	} {
		if sc := remote(Extract(context.Background(), map[string][]string{HeaderTraceparent: {tp}})); sc.IsValid() {
			t.Errorf("%s: extracted %+v", name, sc)
		}
	}
	// A tracestate over the bound is dropped alone.
	sc := remote(Extract(context.Background(), map[string][]string{HeaderTraceparent: {validTP}, HeaderTracestate: {"a=" + strings.Repeat("b", MaxTracestate)}}))
	if !sc.IsValid() || sc.TraceState().Len() != 0 {
		t.Fatalf("long tracestate: %+v", sc)
	}
	// A malformed one too.
	sc = remote(Extract(context.Background(), map[string][]string{HeaderTraceparent: {validTP}, HeaderTracestate: {"=,=,"}}))
	if !sc.IsValid() || sc.TraceState().Len() != 0 {
		t.Fatalf("malformed tracestate: %+v", sc)
	}
	// Only the first value counts.
	sc = remote(Extract(context.Background(), map[string][]string{HeaderTraceparent: {"junk", validTP}}))
	if sc.IsValid() {
		t.Fatalf("second value read: %+v", sc)
	}
}

// Off, nothing is read: the context comes back as it went in.
func TestExtractOff(t *testing.T) {
	Use(nil)
	ctx := context.Background()
	if got := Extract(ctx, map[string][]string{HeaderTraceparent: {validTP}}); got != ctx || Enabled() {
		t.Fatal("tracing off read a traceparent")
	}
	if _, ok := Tracer().Start(ctx, "x"); ok.IsRecording() {
		t.Fatal("the tracer of tracing off records")
	}
}

func TestInjectRoundTrip(t *testing.T) {
	on(t)
	ctx, span := Tracer().Start(Extract(context.Background(), map[string][]string{HeaderTraceparent: {validTP}}), "child")
	defer span.End()
	h := map[string][]string{}
	Inject(ctx, h)
	got := h[HeaderTraceparent]
	if len(got) != 1 || TraceID(got[0]) != validTID || strings.Contains(got[0], "00f067aa0ba902b7") {
		t.Fatalf("injected %v: want the trace of the parent under the child's span id", got)
	}
	empty := map[string][]string{}
	Inject(context.Background(), empty)
	if len(empty) != 0 {
		t.Fatalf("injected %v without a span", empty)
	}
}

func TestTraceIDAndNew(t *testing.T) {
	if TraceID(validTP) != validTID || TraceID("junk") != "" || TraceID(validTP+strings.Repeat("x", 4096)) != "" {
		t.Fatal("TraceID")
	}
	h1, id1 := NewTraceparent()
	h2, id2 := NewTraceparent()
	if TraceID(h1) != id1 || TraceID(h2) != id2 || id1 == id2 || len(h1) != 55 || !strings.HasSuffix(h1, "-01") {
		t.Fatalf("NewTraceparent: %s %s / %s %s", h1, id1, h2, id2)
	}
}

// FuzzExtract: no header value makes Extract panic, and what it accepts is valid.
func FuzzExtract(f *testing.F) {
	f.Add(validTP, "a=1")
	f.Add(validTP+"-"+strings.Repeat("a", 100), strings.Repeat("k=v,", 40))
	f.Add("00--01", "=")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		Use(sdktrace.NewTracerProvider())
		defer Use(nil)
		sc := remote(Extract(context.Background(), map[string][]string{HeaderTraceparent: {tp}, HeaderTracestate: {ts}}))
		if sc.IsValid() && (len(tp) > MaxTraceparent || sc.TraceState().Len() > 32) {
			t.Fatalf("accepted %q / %q", tp, ts)
		}
	})
}
