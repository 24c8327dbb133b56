package test

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a real OTLP/HTTP trace receiver for the tests: an HTTP server on a
// loopback port that takes POST /v1/traces, decodes each ExportTraceServiceRequest with
// the official proto types (gzip or not), keeps its spans, and answers an
// ExportTraceServiceResponse as a collector does.
type otlpReceiver struct {
	URL  string // http://127.0.0.1:PORT, for OTEL_EXPORTER_OTLP_ENDPOINT
	srv  *http.Server
	mu   sync.Mutex
	got  []otlpSpan
	bad  []string      // what could not be decoded
	more chan struct{} // closed, and replaced, at each export
}

// otlpSpan is one span received, with the service.name of its resource.
type otlpSpan struct {
	Service string
	Span    *tracepb.Span
}

func (s otlpSpan) TraceID() string { return hex.EncodeToString(s.Span.TraceId) }
func (s otlpSpan) SpanID() string  { return hex.EncodeToString(s.Span.SpanId) }
func (s otlpSpan) Parent() string  { return hex.EncodeToString(s.Span.ParentSpanId) }

// Attr is the string form of the span's attribute key ("" when it has none).
func (s otlpSpan) Attr(key string) string {
	for _, kv := range s.Span.Attributes {
		if kv.Key != key {
			continue
		}
		switch v := kv.Value.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue
		case *commonpb.AnyValue_BoolValue:
			return strconv.FormatBool(v.BoolValue)
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(v.IntValue, 10)
		}
		return kv.Value.String()
	}
	return ""
}

// startOTLPReceiver starts a receiver, stopped when t ends.
func startOTLPReceiver(t testing.TB) *otlpReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{URL: "http://" + ln.Addr().String(), more: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go r.srv.Serve(ln)
	t.Cleanup(func() { r.srv.Close() })
	return r
}

func (r *otlpReceiver) export(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = http.MaxBytesReader(w, req.Body, 64<<20)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			r.fail(w, err.Error())
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		r.fail(w, err.Error())
		return
	}
	var ex coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &ex); err != nil {
		r.fail(w, err.Error())
		return
	}
	r.mu.Lock()
	for _, rs := range ex.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				r.got = append(r.got, otlpSpan{Service: service, Span: sp})
			}
		}
	}
	close(r.more)
	r.more = make(chan struct{})
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func (r *otlpReceiver) fail(w http.ResponseWriter, why string) {
	r.mu.Lock()
	r.bad = append(r.bad, why)
	r.mu.Unlock()
	http.Error(w, why, http.StatusBadRequest)
}

// await waits, at most bound, until ok holds of the spans received (checked at each
// export), and returns them; it fails t after bound, or on an export that did not decode.
func (r *otlpReceiver) await(t testing.TB, bound time.Duration, what string, ok func([]otlpSpan) bool) []otlpSpan {
	t.Helper()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans, bad, more := append([]otlpSpan(nil), r.got...), r.bad, r.more
		r.mu.Unlock()
		if len(bad) > 0 {
			t.Fatalf("an export did not decode: %v", bad)
		}
		if ok(spans) {
			return spans
		}
		select {
		case <-more:
		case <-deadline.C:
			t.Fatalf("%s: not among the %d spans received within %s", what, len(spans), bound)
		}
	}
}
