package worker

import (
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
	"github.com/ortbus/ortbus/telemetry/telemetrytest"
)

const (
	overlapLib = "ORTBUS_TEST_OVERLAP_LIB"
	overlapDir = "ORTBUS_TEST_OVERLAP_DIR"
)

// TestDecodeOverlapsInference: a real worker (ONNX Runtime, the generated heavy tagger,
// one slot, decode_threads 1) serving PNG tag requests over NATS decodes item k+1 while
// the model runs item k: by the worker's own trace steps, the decode of some next item
// starts before the infer step of the item before it ends (with decoding on the slot
// only, every decode starts after the previous infer ended). Every item is answered
// once; the heartbeat's decode_wait_ms and infer_ms count the slot's time. In a child
// process of its own (one runtime per process).
func TestDecodeOverlapsInference(t *testing.T) {
	testenv.RunChild(t, "TestDecodeOverlapsInferenceChild",
		overlapLib+"="+testenv.RuntimeLib(t, "1.30.0"),
		overlapDir+"="+filepath.Join(testenv.Models(t), onnxgen.TaggerHeavyDir))
}

func TestDecodeOverlapsInferenceChild(t *testing.T) {
	if !testenv.InChild("TestDecodeOverlapsInferenceChild") {
		t.Skip("runs only as a child of TestDecodeOverlapsInference")
	}
	exp := telemetrytest.Record(t)
	imgs := t.TempDir()
	const n = 8
	for i := range n {
		writeNoisePNG(t, filepath.Join(imgs, fmt.Sprintf("%d.png", i)), 640, 640, i)
	}
	src := fmt.Sprintf("[nats]\nurl = \"nats://127.0.0.1:1\"\n[security]\nallowed_roots = [%q]\n"+
		"[pools.cpu]\nruntime = %q\nclasses = [\"interactive\"]\nslots = 1\nthreads = 1\ndecode_threads = 1\nmodels = [\"tagger\"]\n"+
		"[models.tagger]\nkind = \"tagger-pixai\"\ndir = %q\n", imgs, os.Getenv(overlapLib), os.Getenv(overlapDir))
	c, err := config.Parse([]byte(src), "overlap.toml")
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.InProcessNATS(t)
	ready := make(chan *Worker, 1)
	w, err := New(Options{Config: c, Pool: "cpu", ID: "cpu-overlap", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OnReady: func(w *Worker) { ready <- w }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- w.ServeConn(ctx, nc) }()
	defer func() { stop(); <-served }()
	select {
	case <-ready:
	case err := <-served:
		t.Fatalf("worker stopped before serving: %v", err)
	}

	inbox, err := nc.SubscribeSync(nats.NewInbox() + ".>")
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := subjects.Infer("cpu", "interactive")
	for i := range n {
		b, _ := codec.Marshal(&codec.WorkItem{Request: codec.Request{ID: fmt.Sprint(i), Path: filepath.Join(imgs, fmt.Sprintf("%d.png", i)), Model: "tagger", TimeoutMS: 60000}, Op: "tag"})
		m := nats.NewMsg(subj)
		m.Reply, m.Data = inbox.Subject[:len(inbox.Subject)-1]+fmt.Sprint(i), b
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]int{}
	for range n {
		r, err := inbox.NextMsg(60 * time.Second)
		if err != nil {
			t.Fatalf("replies %v: %v", got, err)
		}
		if e := reply.ErrorOf(r); e != nil {
			t.Fatalf("%s answered %v", r.Subject, e)
		}
		got[r.Subject]++
	}
	if r, err := inbox.NextMsg(50 * time.Millisecond); err == nil {
		t.Fatalf("a second answer: %s", r.Subject)
	}

	steps := itemSteps(t, exp.GetSpans())
	overlaps := 0
	for k := 0; k+1 < len(steps); k++ {
		if steps[k+1].decodeStart.Before(steps[k].inferEnd) {
			overlaps++
		}
	}
	hb := w.snapshot()
	t.Logf("%d of %d next items' decodes started before the previous item's inference ended; decode_wait_ms %d, infer_ms %d", overlaps, len(steps)-1, hb.DecodeWaitMS, hb.InferMS)
	if overlaps == 0 {
		t.Fatalf("no decode of item k+1 started while item k ran: %+v", steps)
	}
	if hb.InferMS <= 0 {
		t.Fatalf("heartbeat infer_ms %d after %d runtime calls", hb.InferMS, n)
	}
}

// stepTimes are one item's decode start and infer end, from its worker spans.
type stepTimes struct {
	id                    string
	decodeStart, inferEnd time.Time
	inferStart            time.Time
}

// itemSteps reads each item's decode and infer steps from the recorded spans, in the
// order the items ran (infer start).
func itemSteps(t *testing.T, spans []tracetest.SpanStub) []stepTimes {
	t.Helper()
	byItem := map[string]*stepTimes{}
	parent := map[string]string{} // item span id → request id
	for _, s := range spans {
		if s.Name != "ortbus.worker.item" {
			continue
		}
		for _, a := range s.Attributes {
			if a.Key == "ortbus.request.id" {
				parent[s.SpanContext.SpanID().String()] = a.Value.Emit()
			}
		}
	}
	for _, s := range spans {
		id, ok := parent[s.Parent.SpanID().String()]
		if !ok {
			continue
		}
		st := byItem[id]
		if st == nil {
			st = &stepTimes{id: id}
			byItem[id] = st
		}
		switch s.Name {
		case "ortbus.worker.decode":
			st.decodeStart = s.StartTime
		case "ortbus.worker.infer":
			st.inferStart, st.inferEnd = s.StartTime, s.EndTime
		}
	}
	var out []stepTimes
	for _, st := range byItem {
		if st.decodeStart.IsZero() || st.inferEnd.IsZero() {
			t.Fatalf("item %s: a decode or infer step is missing: %+v", st.id, st)
		}
		out = append(out, *st)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].inferStart.Before(out[b].inferStart) })
	return out
}

// writeNoisePNG writes a w×h PNG of seeded noise (costly to decode, as photos are).
func writeNoisePNG(t *testing.T, path string, w, h, seed int) {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	x := uint32(seed*2654435761 + 1)
	for i := 0; i < len(img.Pix); i += 4 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = uint8(x), uint8(x>>8), uint8(x>>16), 255
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := png.Encode(f, img); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
