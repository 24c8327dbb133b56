package gateway

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/ortbus/ortbus/cache"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/jobs"
	"github.com/ortbus/ortbus/subjects"
	"go.opentelemetry.io/otel/trace"
)

// Reply delivers the one terminal answer of a request over its transport: a result body
// (already encoded for the client) or an error.
type Reply func(body []byte, err *codec.Error)

// pending is one client request from acceptance to its terminal reply: what the client
// asked and how to answer it. It does not change once the request is accepted (L1); where
// the request is in its life is the lifecycle's (lifecycle.go).
type pending struct {
	id       string
	op       string
	class    string
	req      codec.Request
	asJSON   bool
	accepted time.Time
	deadline time.Time
	reply    Reply
	replyTo  string // the client's NATS reply subject ("" over HTTP), for failover
	owner    string // who may cancel it (see canCancel)
	account  string // whose bound it counts in (account.go)
	clientID string // the id its client gave it, when it runs under another (accountScopedID)
	jobOwner string // a job item's: its job's owner (an account), whose pauses hold it (pause.go)
	size     int64  // the request's encoded size, counted against its class queue's bytes
	// cacheTicket: its answer is stored in the result cache (cache.go); set before it is
	// accepted, never after.
	cacheTicket *cacheTicket
	// hit: its answer found in the result cache (cache.go, encoded for its client), set
	// before it is accepted: L1 answers it, unless the client's cancel came first.
	hit []byte
	// answered is set by its one terminal answer (deliver, settled).
	answered atomic.Bool
	// trace: its spans (trace.go), nil while tracing is off; set before it is accepted.
	trace *reqTrace
}

// workOwner is whose work p is, for the pauses that hold it (pause.go, rule 5): its
// account's, or a job item's job owner's; "" for the local owner's.
func (p *pending) workOwner() string {
	if p.owner == ownerJob {
		return p.jobOwner
	}
	return p.account
}

// decodeRequest decodes and checks a client's request body into req.
func decodeRequest(data []byte, asJSON bool, req *codec.Request) *codec.Error {
	if err := codec.Decode(data, req, asJSON); err != nil {
		return codec.AsError(err)
	}
	if err := req.Validate(); err != nil {
		return codec.AsError(err)
	}
	if strings.HasPrefix(req.ID, jobs.ItemIDPrefix) {
		return codec.Errorf(codec.CodeBadRequest, "id: ids starting %q are the gateway's own (job items)", jobs.ItemIDPrefix).With("field", "id")
	}
	return nil
}

// ownerHTTP owns the requests that came over HTTP: only an HTTP cancel may cancel them.
const ownerHTTP = "http"

// ownerOf is the owner of a request sent by by (its reply subject, or ownerHTTP): the
// connection's inbox, i.e. every token of the reply subject but the last. NATS clients
// answer all requests of a connection under <inbox prefix>.<connection nuid>., which
// with per-user inbox prefixes and subscribe permissions no other user can read, and
// without them no other client can guess.
func ownerOf(by string) string {
	if by == ownerHTTP || strings.HasPrefix(by, accountOwnerMark) {
		return by
	}
	if o := subjects.InboxOwner(by); o != "" {
		return o
	}
	return by
}

// canCancel reports whether a cancel sent by by may cancel a request of owner: an
// operator (by ""), the HTTP API for its own requests, or a cancel whose reply subject
// is under the request's owner (the same connection's inbox).
func canCancel(owner, by string) bool {
	switch {
	case by == "":
		return true
	case owner == ownerJob:
		return false // a job's items are cancelled through the job
	case by == ownerHTTP || owner == ownerHTTP:
		return by == owner
	case strings.HasPrefix(by, accountOwnerMark) || strings.HasPrefix(owner, accountOwnerMark):
		return by == owner
	}
	return strings.HasPrefix(by, owner+".")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ownerJob owns the requests of job items: only the job (its cancel, or this gateway's
// stop) and operators may cancel them (canCancel).
const ownerJob = "job"

// decodeChecked decodes a request body into v and runs its check.
func decodeChecked(data []byte, v any, asJSON bool, check func() error) *codec.Error {
	if err := codec.Decode(data, v, asJSON); err != nil {
		return codec.AsError(err)
	}
	if err := check(); err != nil {
		return codec.AsError(err)
	}
	return nil
}

// respond is the one place that writes a reply on NATS, to the micro request r: the
// result body (JSON if the client asked), or the error e with its status and message in
// the headers. A result over maxPayload (the connection's) is answered reply_too_large
// instead.
func respond(r micro.Request, asJSON bool, body []byte, e *codec.Error, maxPayload int64) error {
	var opts []micro.RespondOpt
	if asJSON {
		opts = append(opts, micro.WithHeaders(micro.Headers{codec.HeaderContentType: {codec.ContentTypeJSON}}))
	}
	if e == nil {
		e = reply.TooLarge(len(body), maxPayload)
	}
	if e != nil {
		e = boundMessage(e)
		b, _ := codec.Encode(e, asJSON)
		return r.Error(strconv.Itoa(e.Code.Status()), e.Message, b, opts...)
	}
	return r.Respond(body, opts...)
}

// maxErrorMessage bounds an error reply's message (it travels in a header too): a
// message that echoes a huge input would make the reply unsendable.
const maxErrorMessage = 4 << 10

// boundMessage returns e with its message cut to maxErrorMessage bytes.
func boundMessage(e *codec.Error) *codec.Error {
	if len(e.Message) <= maxErrorMessage {
		return e
	}
	c := *e
	c.Message = strings.ToValidUTF8(e.Message[:maxErrorMessage], "") + "…"
	return &c
}

// cacheTicket is a looked-up request's key, what its file hashed as, and its flight when
// it leads one.
type cacheTicket struct {
	key    cache.Key
	file   cache.FileSum
	shared *cache.Flight
}

// claimTimeout is how long a dispatched request may go unclaimed: one heartbeat interval
// of cfg, and at least 100 ms.
func claimTimeout(cfg *config.Config) time.Duration {
	return max(cfg.Health.HeartbeatInterval.D(), 100*time.Millisecond)
}

// replyDirect reports whether the worker is to answer p straight to its client (the item's
// reply subject is the client's, and the worker tells the gateway with a "done" claim):
// a request that came over NATS in msgpack, not a job item, to a pool without a path_map
// (whose output paths the gateway maps back), on a gateway without failover (which keeps
// each answer) and without gateway.relay_replies, whose reply subject is not an import's
// (subjects.IsImportReply: nats-server refuses it as the reply subject of a work item). It saves the reply's leg through the
// gateway; the gateway still owns the request: its deadline, retries after a worker's
// death, cancels, metrics and measured service times.
func replyDirect(cfg *config.Config, p *pending, pool string) bool {
	gw := cfg.Gateway
	return p.replyTo != "" && !subjects.IsImportReply(p.replyTo) && p.clientID == "" && !p.asJSON && p.owner != ownerJob && len(cfg.Pool(pool).PathMap) == 0 && !gw.Failover && !gw.RelayReplies && p.cacheTicket == nil
}

// reqTrace is a request's spans: the request span, set once, and the attempt's, which
// the loop, the relays and the cache's goroutine reach under mu.
type reqTrace struct {
	ctx  context.Context // carries the request span
	span trace.Span

	mu     sync.Mutex
	send   trace.Span // the current attempt's span (nil between attempts)
	queued time.Time  // since when it waits in its class queue
	device string     // the device of its last attempt's pool
}
