package gateway

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/micro"
	dto "github.com/prometheus/client_model/go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/subjects"
)

// unitConfig is a gateway with two remote pools (no processes to start).
const unitConfig = `
[nats]
url = "nats://127.0.0.1:1"
[security]
allowed_roots = ["/srv"]
[classes.interactive]
chain = ["fast", "bulk"]
[classes.interactive.models]
tag = "tagger"
[classes.batch]
chain = ["bulk"]
[pools.fast]
local = false
ep = "cpu"
classes = ["urgent", "interactive"]
models = ["tagger", "ccip"]
[pools.bulk]
local = false
ep = "cpu"
classes = ["interactive", "batch"]
models = ["tagger"]
[models.tagger]
kind = "tagger-pixai"
dir = "/srv/m/tagger"
[models.ccip]
kind = "ccip"
dir = "/srv/m/ccip"
`

// unitGateway is a gateway in process, on an in-process NATS server, with no workers
// and no dispatch loop: requests are accepted and queued, or refused, exactly as the
// real one does.
func unitGateway(t testing.TB) *Gateway {
	t.Helper()
	return unitGatewayOf(t, unitConfig)
}

// unitGatewayOf is unitGateway on the config toml.
func unitGatewayOf(t testing.TB, toml string) *Gateway {
	t.Helper()
	c, err := config.Parse([]byte(toml), "unit.toml")
	if err != nil {
		t.Fatal(err)
	}
	g := newGateway(c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.id, g.nc = "unit", testenv.InProcessNATS(t)
	if err := g.build(c, "", ""); err != nil {
		t.Fatal(err)
	}
	g.tracker.SetPools(nil) // every pool tracked: a test beats workers of pools the config does not name
	t.Cleanup(g.failover.close)
	t.Cleanup(g.d.start(false)) // events only: the queues hold what they get
	return g
}

// fakeRequest is a micro.Request that records every reply.
type fakeRequest struct {
	data    []byte
	headers micro.Headers
	reply   string
	mu      sync.Mutex
	replies []fakeReply
}

type fakeReply struct {
	code string
	body []byte
}

func (r *fakeRequest) Respond(b []byte, _ ...micro.RespondOpt) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replies = append(r.replies, fakeReply{body: b})
	return nil
}
func (r *fakeRequest) RespondJSON(any, ...micro.RespondOpt) error { panic("not used") }
func (r *fakeRequest) Error(code, _ string, b []byte, _ ...micro.RespondOpt) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replies = append(r.replies, fakeReply{code: code, body: b})
	return nil
}
func (r *fakeRequest) Data() []byte           { return r.data }
func (r *fakeRequest) Headers() micro.Headers { return r.headers }
func (r *fakeRequest) Subject() string        { return "" }
func (r *fakeRequest) Reply() string          { return r.reply }

// FuzzHandle drives the gateway's API handler with arbitrary bodies on every op, msgpack
// and JSON, with arbitrary reply subjects and the resend header on or off: no panic
// (counted by the guard); a request whose reply subject is not a reply destination
// (subjects.CheckReply) is dropped and counted, never answered nor queued; every other
// request is either answered exactly once with a contract code or accepted into a class
// queue (an accepted request is then cancelled and must be answered cancelled).
func FuzzHandle(f *testing.F) {
	req := codec.Request{ID: "r1", Path: "/srv/a.png", Class: "batch", TimeoutMS: 500}
	for _, asJSON := range []bool{false, true} {
		b, _ := codec.Encode(&req, asJSON)
		f.Add(b, uint8(0), asJSON, "_INBOX.fuzz.1", false)
		f.Add(b, uint8(0), asJSON, "$JS.API.STREAM.PURGE.ORTBUS_JOB_ITEMS", false)
		f.Add(b, uint8(0), asJSON, "ortbus.ops.cancel", true)
		f.Add(b, uint8(0), asJSON, "_INBOX."+strings.Repeat("a", 4096), false)
		f.Add(b, uint8(0), asJSON, "_INBOX_client.abc.7", true)
		f.Add([]byte{0x81, 0xa5, 'c', 'l', 'a', 's', 's', 0xa1, 0xff}, uint8(0), asJSON, "_INBOX.fuzz.1", false)
		f.Add([]byte{0x81, 0xaa, 'c', 'a', 'n', 'd', 'i', 'd', 'a', 't', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}, uint8(2), asJSON, "_INBOX.fuzz.1", false)
		f.Add([]byte(`{"id":"x","timeout_ms":9223372036854775807}`), uint8(0), asJSON, "_INBOX.fuzz.1", false)
		f.Add([]byte(`{"id":"a.b"}`), uint8(6), asJSON, "_INBOX.fuzz.1", false)
		byPath := codec.Request{ID: "r2", Model: "tiny", InputPaths: map[string]string{"x": "/srv/x.npy"}, OutputPaths: map[string]string{"y": "/srv/spool/y.npy"}}
		b, _ = codec.Encode(&byPath, asJSON)
		f.Add(b, uint8(slices.Index(subjects.Ops, subjects.OpInfer)), asJSON, "_INBOX.fuzz.1", false)
	}
	// A lease acquire the cpu's budget cannot hold, waiting for room (leasewait.go).
	f.Add([]byte(`{"action":"acquire","device":"cpu","bytes":1152921504606846976,"wait_ms":60000}`), uint8(slices.Index(subjects.Ops, subjects.OpLease)), true, "_INBOX.fuzz.1", false)
	g := unitGateway(f)
	f.Fuzz(func(t *testing.T, data []byte, opIndex uint8, asJSON bool, replyTo string, resend bool) {
		op := subjects.Ops[int(opIndex)%len(subjects.Ops)]
		r := &fakeRequest{data: data, headers: micro.Headers{}, reply: replyTo}
		if asJSON {
			r.headers[codec.HeaderContentType] = []string{codec.ContentTypeJSON}
		}
		if resend {
			r.headers[codec.HeaderResend] = []string{"1"}
		}
		panics, bad := guard.Panics(), badCount(g, "reply_subject")
		g.handle(op, r, false)
		g.d.inspect(func(*lifecycle) {}) // the loop has taken what the handler posted
		if guard.Panics() != panics {
			t.Fatalf("op %s: a panic was recovered", op)
		}
		r.mu.Lock()
		n := len(r.replies)
		r.mu.Unlock()
		if replyTo == "" || subjects.CheckReply(replyTo, g.conf().NATS.Replies()) != nil {
			if left := len(unanswered(g)); n != 0 || left != 0 {
				t.Fatalf("op %s, reply subject %q: %d replies, %d in flight; want it dropped", op, replyTo, n, left)
			}
			if replyTo != "" && badCount(g, "reply_subject") != bad+1 {
				t.Fatalf("reply subject %q dropped uncounted", replyTo)
			}
			return
		}
		if n == 0 && g.budget.waits.waiting() > 0 {
			// A lease acquire waiting for room (leasewait.go): the waits' end answers it.
			endWaits(g)
		} else if n == 0 {
			// Accepted: it waits in a queue. Cancel it as its sender: answered cancelled.
			var id string
			for _, k := range unanswered(g) {
				id = k
			}
			if id == "" || !g.d.cancelAs(id, "", "") { // as an operator
				t.Fatalf("op %s: no reply and nothing in flight", op)
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.replies) != 1 {
			t.Fatalf("op %s: %d replies", op, len(r.replies))
		}
		if rep := r.replies[0]; rep.code != "" {
			var e codec.Error
			if err := codec.Decode(rep.body, &e, asJSON); err != nil || !e.Code.Known() {
				t.Fatalf("op %s: error reply %q is not a contract error: %v", op, rep.body, err)
			}
		}
		if left := len(unanswered(g)); left != 0 {
			t.Fatalf("op %s: %d requests left in flight", op, left)
		}
	})
}

// endWaits answers g's waiting lease acquires as its stop does (unavailable), and lets
// acquires wait again.
func endWaits(g *Gateway) {
	w := g.budget.waits
	w.stop()
	w.mu.Lock()
	w.stopped = false
	w.mu.Unlock()
}

// unanswered are the ids of the requests g's loop holds unanswered.
func unanswered(g *Gateway) []string {
	var ids []string
	g.d.inspect(func(lc *lifecycle) {
		for id := range lc.byID {
			ids = append(ids, id)
		}
	})
	return ids
}

// badCount is the gateway's ortbus_bad_messages_total{kind}.
func badCount(g *Gateway, kind string) float64 {
	var m dto.Metric
	if err := g.metrics.badMsgs.WithLabelValues(kind).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
