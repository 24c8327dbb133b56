package client

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/subjects"
	"github.com/ortbus/ortbus/telemetry"
)

// headersSeen answers ortbus.v1.tag on nc with an empty result and hands over the
// headers of each request.
func headersSeen(t *testing.T, nc *nats.Conn) <-chan nats.Header {
	t.Helper()
	seen := make(chan nats.Header, 4)
	subj, _ := subjects.API(subjects.OpTag)
	sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
		seen <- m.Header
		b, _ := codec.Marshal(&codec.TagReply{})
		m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return seen
}

// A call carries the caller's active span (any provider's: the app's own), or an
// explicit traceparent, or nothing; with failover too.
func TestCallCarriesTraceContext(t *testing.T) {
	nc := testenv.InProcessNATS(t)
	seen := headersSeen(t, nc)
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	appCtx, span := tp.Tracer("app").Start(context.Background(), "app op")
	defer span.End()
	want := span.SpanContext()
	explicit := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	for _, failover := range []bool{false, true} {
		c := New(nc)
		c.Failover = failover
		call := func(ctx context.Context) nats.Header {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := c.Tag(ctx, codec.Request{Path: "/srv/a.png"}); err != nil {
				t.Fatal(err)
			}
			return <-seen
		}
		h := call(appCtx)
		if got := h.Get(telemetry.HeaderTraceparent); telemetry.TraceID(got) != want.TraceID().String() || got[36:52] != want.SpanID().String() {
			t.Errorf("failover %v: the active span's call carries %q, want span %s", failover, got, want.SpanID())
		}
		h = call(WithTraceparent(appCtx, explicit, "k=v"))
		if h.Get(telemetry.HeaderTraceparent) != explicit || h.Get(telemetry.HeaderTracestate) != "k=v" {
			t.Errorf("failover %v: the explicit traceparent's call carries %v", failover, h)
		}
		h = call(context.Background())
		if h.Get(telemetry.HeaderTraceparent) != "" {
			t.Errorf("failover %v: a call without a span carries %q", failover, h.Get(telemetry.HeaderTraceparent))
		}
	}
}
