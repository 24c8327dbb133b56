package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/telemetry"
	"github.com/ortbus/ortbus/telemetry/telemetrytest"
)

// runTraced sends one tag item with the header traceparent (none when "") through the
// unit worker's accept and one slot's run, and returns its reply.
func runTraced(t *testing.T, w *Worker, nc *nats.Conn, traceparent string) *nats.Msg {
	t.Helper()
	inbox, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := codec.Marshal(&codec.WorkItem{Request: codec.Request{ID: "r1", Path: "/srv/a.png", TimeoutMS: 5000}, Op: "tag"})
	m := nats.NewMsg("infer.cpu.interactive")
	m.Reply, m.Data = inbox.Subject, b
	if traceparent != "" {
		m.Header.Set(telemetry.HeaderTraceparent, traceparent)
	}
	w.serve.workHandler("interactive")(m)
	unit := w.q.take()
	w.slots.runUnit(unit)
	w.q.done(unit)
	rep, err := inbox.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if e := reply.ErrorOf(rep); e != nil {
		t.Fatalf("answered %v", e)
	}
	return rep
}

// An item's spans continue the trace its headers carry: the item span is the child of
// the sender's span, and queue, decode, infer and encode are its children, with the
// attributes users filter on.
func TestItemSpans(t *testing.T) {
	exp := telemetrytest.Record(t)
	w, nc := unitWorker(t)
	runTraced(t, w, nc, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	spans := exp.GetSpans()
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	item, ok := byName["ortbus.worker.item"]
	if !ok {
		t.Fatalf("no item span among %d", len(spans))
	}
	if item.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || item.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("item span in trace %s under %s", item.SpanContext.TraceID(), item.Parent.SpanID())
	}
	attrs := map[string]string{}
	for _, a := range item.Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	for k, v := range map[string]string{"ortbus.op": "tag", "ortbus.model": "tagger", "ortbus.pool": "cpu", "ortbus.worker": "cpu-unit", "ortbus.class": "interactive", "ortbus.request.id": "r1"} {
		if attrs[k] != v {
			t.Errorf("item span %s = %q, want %q", k, attrs[k], v)
		}
	}
	if _, ok := attrs["ortbus.error.code"]; ok {
		t.Errorf("a result's span has an error code: %v", attrs)
	}
	for _, name := range []string{"ortbus.worker.queue", "ortbus.worker.decode", "ortbus.worker.infer", "ortbus.worker.encode"} {
		s, ok := byName[name]
		if !ok || s.Parent.SpanID() != item.SpanContext.SpanID() || s.SpanContext.TraceID() != item.SpanContext.TraceID() {
			t.Errorf("%s: found %v, parent %s, want the item span %s", name, ok, s.Parent.SpanID(), item.SpanContext.SpanID())
		}
	}
}

// A malformed or oversized traceparent starts a new trace: the item is answered as any
// other.
func TestItemSpansHostileTraceparent(t *testing.T) {
	exp := telemetrytest.Record(t)
	w, nc := unitWorker(t)
	for _, tp := range []string{"00-zz-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-" + strings.Repeat("a", 4096)} {
		exp.Reset()
		runTraced(t, w, nc, tp)
		for _, s := range exp.GetSpans() {
			if s.Name == "ortbus.worker.item" && (s.Parent.IsValid() || s.SpanContext.TraceID().String() == "4bf92f3577b34da6a3ce929d0e0e4736") {
				t.Fatalf("traceparent %.40q: the item span continues it", tp)
			}
		}
	}
}

// Tracing off, no span is made and the item carries no trace state.
func TestItemUntraced(t *testing.T) {
	telemetry.Use(nil)
	w, nc := unitWorker(t)
	j := &job{msg: nats.NewMsg("x"), received: time.Now()}
	j.msg.Header.Set(telemetry.HeaderTraceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	j.trace = startTrace(j.msg.Header, j.received, "interactive", w.pool.Name, w.id, w.pool.Device)
	if j.trace != nil {
		t.Fatal("a span was started with tracing off")
	}
	runTraced(t, w, nc, "")
}
