package worker

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/ort"
	"github.com/ortbus/ortbus/subjects"
)

// echoModel is a model that serves tag without a runtime.
type echoModel struct{}

func (echoModel) Name() string                      { return "tagger" }
func (echoModel) Kind() string                      { return "tagger-pixai" }
func (echoModel) Ops() []string                     { return []string{"tag"} }
func (echoModel) Batchable(string) bool             { return true }
func (echoModel) MaxBatch() int                     { return 0 }
func (echoModel) Sessions() []*ort.Session          { return nil }
func (echoModel) Warmup(context.Context, int) error { return nil }
func (echoModel) Close() error                      { return nil }
func (echoModel) Prepare(op string, req *codec.WorkItem) (models.Item, error) {
	return req.Path, nil
}
func (echoModel) Run(_ context.Context, _ string, items []models.Item) ([]codec.Replier, []error) {
	out := make([]codec.Replier, len(items))
	for i := range items {
		out[i] = &codec.TagReply{}
	}
	return out, make([]error, len(items))
}

// unitWorker is a worker in process, on an in-process NATS server, with one model and no
// runtime; its slots are not started, so accepted items stay queued.
func unitWorker(t testing.TB) (*Worker, *nats.Conn) {
	t.Helper()
	c, err := config.Parse([]byte(`
[nats]
url = "nats://127.0.0.1:1"
[security]
allowed_roots = ["/srv"]
[pools.cpu]
classes = ["interactive", "batch"]
models = ["tagger"]
[models.tagger]
kind = "tagger-pixai"
dir = "/srv/m"
`), "unit.toml")
	if err != nil {
		t.Fatal(err)
	}
	nc := testenv.InProcessNATS(t)
	p := c.Pools["cpu"]
	w := testWorker(c, p.Name, "cpu-unit", nc)
	serveReady(w.models, echoModel{})
	return w, nc
}

// serveReady makes each of ms ready in s under its own name (a copy of the same name
// replaced).
func serveReady(s *modelSet, ms ...models.Model) {
	for _, m := range ms {
		s.serve(m, codec.ModelStatus{Name: m.Name(), Kind: m.Kind(), State: codec.ModelReady, Loaded: true}, nil)
	}
}

// FuzzAccept drives the worker's work-item handler with arbitrary bodies, msgpack and
// JSON, and arbitrary reply subjects: no panic; an item whose reply subject is not a
// reply destination (subjects.CheckReply) is dropped and counted, nothing published on
// its behalf; every other item is answered exactly once, on its reply subject, with a
// result or a contract error — at once, or (queued) when it is cancelled. Claims go only
// to claim subjects.
func FuzzAccept(f *testing.F) {
	item := codec.WorkItem{Request: codec.Request{ID: "r1", Path: "/srv/a.png", TimeoutMS: 5000}, Op: "tag", ClaimTo: "ortbus.claim.gw"}
	for _, asJSON := range []bool{false, true} {
		b, _ := codec.Encode(&item, asJSON)
		f.Add(b, asJSON, "_INBOX.fuzz.1")
		f.Add(b, asJSON, "$JS.API.STREAM.PURGE.ORTBUS_JOB_ITEMS")
		f.Add(b, asJSON, "ortbus.ops.cancel")
		f.Add(b, asJSON, "_INBOX."+strings.Repeat("a", 4096))
		f.Add(b, asJSON, "_R_.abc.def")
		f.Add(b, asJSON, "")
		f.Add([]byte{0x81, 0xaa, 'c', 'a', 'n', 'd', 'i', 'd', 'a', 't', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}, asJSON, "_INBOX.fuzz.1")
		f.Add([]byte(`{"id":"r2","claim_to":"ortbus.v1.tag","op":"tag"}`), asJSON, "_INBOX.fuzz.1")
		f.Add([]byte(`{"id":"r5","path":"/srv/a.png","op":"tag","claim_to":"ortbus.claim.gw","reply_direct":true,"attempt":2}`), asJSON, "_INBOX.fuzz.1")
		f.Add([]byte(`{"id":"r4","op":"infer","input_paths":{"x":"/srv/x.npy"},"output_dir":"/srv/spool"}`), asJSON, "_INBOX_client.q.2")
		f.Add([]byte(`{"id":"r3","deadline_unix_ms":-9223372036854775808,"timeout_ms":9223372036854775807}`), asJSON, "_INBOX.fuzz.1")
	}
	w, nc := unitWorker(f)
	all, err := nc.SubscribeSync(">") // everything published, to catch a stray claim or reply
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, asJSON bool, replyTo string) {
		m := nats.NewMsg("infer.cpu.interactive")
		m.Reply, m.Data = replyTo, data
		if asJSON {
			m.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
		}
		// An item without a reply subject is run and answered to nobody (its sender asked
		// for no answer); it is no bad message.
		noReply := replyTo == ""
		valid := noReply || subjects.CheckReply(replyTo, w.serve.replies) == nil
		panics, bad := guard.Panics(), w.serve.badMessages.Load()
		w.serve.workHandler("interactive")(m)
		if guard.Panics() != panics {
			t.Fatal("a panic was recovered")
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if _, _, held := w.q.counts(); len(held) == 1 {
			if !valid {
				t.Fatalf("an item with reply subject %q was queued", replyTo)
			}
			// Queued: cancel it; it is answered cancelled.
			if j, found := w.q.cancel(held[0]); !found || j == nil {
				t.Fatal("queued item not found by its id")
			} else {
				w.reply.answer(j, nil, codec.Errorf(codec.CodeCancelled, "cancelled"))
			}
			nc.Flush()
		}
		if got := w.serve.badMessages.Load() - bad; valid != (got == 0) {
			t.Fatalf("reply subject %q (valid %v): %d counted bad", replyTo, valid, got)
		}
		// The gateway's part: a claim that asks for a verdict (a reply_direct item's) gets
		// "own", and the reply it held goes out.
		var out []*nats.Msg
		for o, err := all.NextMsg(0); err == nil; o, err = all.NextMsg(0) {
			out = append(out, o)
			var c codec.Claim
			if o.Reply != "" && strings.HasPrefix(o.Subject, "ortbus.claim.") && codec.Unmarshal(o.Data, &c) == nil {
				if o.Reply != w.reply.verdictTo || c.State != codec.ClaimTaken {
					t.Fatalf("claim %+v asks for a verdict on %q", c, o.Reply)
				}
				w.reply.gate.decide(codec.ClaimVerdict{ID: c.ID, Attempt: c.Attempt, Own: true})
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
			}
		}
		nReplies := 0
		for _, o := range out {
			switch {
			case o.Subject == "infer.cpu.interactive":
			case valid && o.Subject == replyTo:
				nReplies++
				if e := reply.ErrorOf(o); e != nil && !e.Code.Known() {
					t.Fatalf("error reply %+v", e)
				}
			case valid && strings.HasPrefix(o.Subject, "ortbus.claim.") && strings.HasSuffix(o.Subject, ".cpu.cpu-unit") && strings.Count(o.Subject, ".") == 4:
			default:
				t.Fatalf("reply subject %q (valid %v): published on %q", replyTo, valid, o.Subject)
			}
		}
		if want := map[bool]int{true: 1, false: 0}[valid && !noReply]; nReplies != want {
			t.Fatalf("reply subject %q: %d replies, want %d", replyTo, nReplies, want)
		}
	})
}
