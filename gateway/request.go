package gateway

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/jobs"
	"github.com/ortbus/ortbus/subjects"
)

// Reply delivers the one terminal answer of a request over its transport: a result body
// (already encoded for the client) or an error.
type Reply func(body []byte, err *codec.Error)

// pending is one client request from acceptance to its terminal reply: what the client
// asked and how to answer it. It does not change once the request is accepted (L1); where
// the request is in its life is the lifecycle's (lifecycle.go, flight).
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
	tenant   string // whose bound it counts in (identity.go)
	clientID string // the id its client gave it, when it runs under another (tenantID)
	jobOwner string // a job item's: its job's owner (a tenant), whose pauses hold it (pause.go)
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
// tenant's, or a job item's job owner's; "" for the local owner's.
func (p *pending) workOwner() string {
	if p.owner == ownerJob {
		return p.jobOwner
	}
	return p.tenant
}

// claimTimeout is how long a dispatched request may go unclaimed: one heartbeat interval
// of cfg, and at least 100 ms.
func claimTimeout(cfg *config.Config) time.Duration {
	return max(cfg.Health.HeartbeatInterval.D(), 100*time.Millisecond)
}

// submitFrom accepts a client request for op: decode, validate, route check, queue.
// ctx carries the trace context its headers gave (telemetry.Extract); replyTo is its NATS
// reply subject ("" over HTTP), owner who may cancel it, tenant whose bound it counts in
// (identity.go).
func (g *Gateway) submitFrom(ctx context.Context, op string, data []byte, asJSON bool, replyTo, owner, tenant string, reply Reply) {
	p := &pending{op: op, asJSON: asJSON, accepted: time.Now(), reply: reply, replyTo: replyTo, owner: owner, tenant: tenant, size: int64(len(data))}
	traceStart(ctx, p)
	if e := decodeRequest(data, asJSON, &p.req); e != nil {
		g.d.deliver(p, "", nil, e)
		return
	}
	if p.req.ID == "" {
		p.req.ID = nuid.Next()
	}
	if tenant != "" {
		// Ids are per tenant (identity.go, rule 3): it runs under the gateway's id for it.
		p.clientID, p.req.ID = p.req.ID, tenantID(tenant, p.req.ID)
	}
	if g.cache.front(p) {
		return // looked up in the result cache first (cache.go), then submitted
	}
	g.d.submit(p)
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

// submit accepts a decoded and validated request (p.req, whose id is set) for p.op:
// class, deadline, model and pool checks and the route check here, under one
// configuration, then the loop takes it (L1).
func (d *dispatcher) submit(p *pending) {
	cfg := d.conf()
	pools, e := resolve(cfg, p)
	if e == nil {
		e = mapPaths(cfg, p, pools)
	}
	if e != nil {
		d.deliver(p, "", nil, e)
		return
	}
	d.post(evAccept{p: p, pools: pools})
}

// resolve fills in p's id, class, deadline and default model from cfg, checks that its
// class, model and pool exist and fit, and returns the pools that may run it.
func resolve(cfg *config.Config, p *pending) ([]string, *codec.Error) {
	p.id = p.req.ID
	p.class = p.req.Class
	if p.class == "" {
		p.class = subjects.ClassInteractive
	}
	cl, ok := cfg.Classes[p.class]
	if !ok {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q (classes: %v)", p.class, cfg.ClassNames())
	}
	timeout := cl.Timeout.D()
	if p.req.TimeoutMS > 0 {
		// Compared in ms first: a huge timeout_ms would overflow a Duration.
		timeout = cl.MaxTimeout.D()
		if p.req.TimeoutMS < timeout.Milliseconds() {
			timeout = time.Duration(p.req.TimeoutMS) * time.Millisecond
		}
	}
	p.deadline = p.accepted.Add(timeout)
	if p.req.Model == "" {
		p.req.Model = cl.Models[p.op]
	}
	if p.req.Model != "" {
		if _, ok := cfg.Models[p.req.Model]; !ok {
			return nil, codec.Errorf(codec.CodeUnknownModel, "model %q is not configured", p.req.Model).With("model", p.req.Model)
		}
	}
	if p.req.Pool != "" {
		pc, ok := cfg.Pools[p.req.Pool]
		if !ok {
			return nil, codec.Errorf(codec.CodeUnknownPool, "pool %q is not configured (pools: %v)", p.req.Pool, cfg.PoolNames()).With("pool", p.req.Pool)
		}
		if !contains(pc.Classes, p.class) {
			return nil, codec.Errorf(codec.CodeBadRequest, "pool %s does not serve class %s", p.req.Pool, p.class).With("pool", p.req.Pool)
		}
	}
	pools := candidates(cfg, p)
	if len(pools) == 0 && p.req.Device != "" && len(poolsFor(cfg, chainOf(cfg, p), p.op, p.req.Model)) > 0 {
		return nil, codec.Errorf(codec.CodeUnknownPool, "no pool of class %s on device %q serves op %s%s", p.class, p.req.Device, p.op, modelSuffix(p.req.Model)).With("device", p.req.Device)
	}
	if len(pools) == 0 {
		return nil, codec.Errorf(codec.CodeUnknownModel, "no pool of class %s loads a model for op %s%s", p.class, p.op, modelSuffix(p.req.Model))
	}
	return pools, nil
}

func modelSuffix(m string) string {
	if m == "" {
		return ""
	}
	return " (model " + m + ")"
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

// onDead is called by the tracker when a worker is judged dead: the loop answers or
// retries every request it held (L7).
func (d *dispatcher) onDead(id, pool, why string) {
	// A silent local worker is killed first, and its requests retried once it is gone:
	// while it lives its subscription stays in its pool's queue group, and a retry could
	// be delivered to it again.
	d.supervisor.workerDead(id, why)
	others := 0
	for _, w := range d.tracker.Live(pool) {
		if w.HB.Worker != id {
			others++
		}
	}
	d.post(evDied{pool: pool, worker: id, why: why, others: others})
}

// onClaim records which worker holds a request. A claim is dropped unless its body
// names the pool and worker of its subject (ortbus.claim.<gateway>.<pool>.<worker>),
// which under the cluster permissions only that pool's workers may publish; and it only
// counts for the request's current dispatch (its pool and attempt).
func (d *dispatcher) onClaim(m *nats.Msg) {
	var c codec.Claim
	ps, err := subjects.Parse(m.Subject)
	if err != nil || ps.Kind != subjects.KindClaim || codec.Unmarshal(m.Data, &c) != nil || c.Pool != ps.Pool || c.Worker != ps.Worker {
		d.metrics.bad("claim")
		return
	}
	d.post(evClaim{c})
}

// ownerHTTP owns the requests that came over HTTP: only an HTTP cancel may cancel them.
const ownerHTTP = "http"

// ownerOf is the owner of a request sent by by (its reply subject, or ownerHTTP): the
// connection's inbox, i.e. every token of the reply subject but the last. NATS clients
// answer all requests of a connection under <inbox prefix>.<connection nuid>., which
// with per-user inbox prefixes and subscribe permissions no other user can read, and
// without them no other client can guess.
func ownerOf(by string) string {
	if by == ownerHTTP || strings.HasPrefix(by, tenantOwnerMark) {
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
	case strings.HasPrefix(by, tenantOwnerMark) || strings.HasPrefix(owner, tenantOwnerMark):
		return by == owner
	}
	return strings.HasPrefix(by, owner+".")
}

// cancelAs cancels a queued or in-flight request by id for the sender by (see
// canCancel), and reports whether it found one (L9). A cancel that may not cancel the
// request finds nothing, as if the id were unknown.
func (d *dispatcher) cancelAs(id, by, tenant string) bool {
	return d.cancel(tenantID(tenant, id), by, tenant, false) // a tenant names its own ids (identity.go, rule 3)
}

// cancel posts a cancel of the gateway's id and waits for its finding; with onlyKnown
// an unknown id is not remembered as cancelled.
func (d *dispatcher) cancel(id, by, tenant string, onlyKnown bool) bool {
	found := make(chan bool, 1)
	d.post(evCancel{id: id, by: by, tenant: tenant, onlyKnown: onlyKnown, found: found})
	select {
	case ok := <-found:
		return ok
	case <-d.loopDone:
		return false
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
