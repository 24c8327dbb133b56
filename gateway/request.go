package gateway

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/jobs"
	"github.com/ortbus/ortbus/sched"
	"github.com/ortbus/ortbus/subjects"
)

// Reply delivers the one terminal answer of a request over its transport: a result body
// (already encoded for the client) or an error.
type Reply func(body []byte, err *codec.Error)

// pending is one client request from acceptance to its terminal reply.
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
	size     int64  // the request's encoded size, counted against its class queue's bytes
	once     sync.Once

	// Guarded by flights.mu.
	attempt int    // dispatches so far
	deaths  int    // holders that died with it
	pool    string // where it is in flight ("" while queued)
	target  string // the worker it is sent to ("" for the pool's queue group); set by hold
	worker  string // the claiming worker, once known
	cancel  context.CancelCauseFunc
	done    chan<- codec.Claim // where a "done" claim goes, while a reply_direct attempt waits
	// cancelAsked: the client cancelled it while it was between queues (accepted and
	// not yet queued, or leaving the queue for a pool); it is answered cancelled there.
	cancelAsked bool
}

// errLost is the cause of an in-flight request's cancellation when its worker died.
type errLost struct{ worker, why string }

func (e *errLost) Error() string { return "worker " + e.worker + " lost: " + e.why }

// errUnclaimed is the cause of an in-flight request's cancellation when no worker claimed
// it in time: a worker claims an item the moment it receives it, so an unclaimed one was
// delivered to a worker that is gone (a dead worker's subscription lingers in the server
// until the server notices the death). It is dispatched again; that is no worker's death.
// (When a worker of the pool died after the dispatch, the request is taken as held by it
// instead — a worker that crashes at once may die before its claim leaves it — and
// cancelled with errLost.)
type errUnclaimed struct{ after time.Duration }

func (e *errUnclaimed) Error() string { return "not claimed within " + e.after.String() }

// claimTimeout is how long a dispatched request may go unclaimed: one heartbeat interval,
// and at least 100 ms.
func (g *Gateway) claimTimeout() time.Duration {
	return max(g.cfg.Health.HeartbeatInterval.D(), 100*time.Millisecond)
}

// answer sends the terminal reply once; later calls are ignored. It also clears the
// request from the in-flight table.
func (g *Gateway) answer(p *pending, body []byte, err *codec.Error) {
	outcome := codec.Code("")
	if err != nil {
		outcome = err.Code
	}
	g.settle(p, outcome, func() {
		p.reply(body, err)
		g.failover.record(p, true, body, err)
	})
}

// settle ends p once, with outcome (its error code, "" for a result): out of the
// in-flight table, counted in the metrics, then then (sending the answer, or what else
// its end needs). Later calls for p are ignored.
func (g *Gateway) settle(p *pending, outcome codec.Code, then func()) {
	p.once.Do(func() {
		g.fl.finish(p)
		label := "ok"
		if outcome != "" {
			label = string(outcome)
		}
		g.metrics.observe(p, label)
		then()
	})
}

// submitFrom accepts a client request for op: decode, validate, route check, queue.
// replyTo is its NATS reply subject ("" over HTTP), owner who may cancel it, tenant
// whose bound it counts in (identity.go).
func (g *Gateway) submitFrom(op string, data []byte, asJSON bool, replyTo, owner, tenant string, reply Reply) {
	p := &pending{op: op, asJSON: asJSON, accepted: time.Now(), reply: reply, replyTo: replyTo, owner: owner, tenant: tenant, size: int64(len(data))}
	if err := codec.Decode(data, &p.req, asJSON); err != nil {
		g.answer(p, nil, codec.AsError(err))
		return
	}
	if err := p.req.Validate(); err != nil {
		g.answer(p, nil, codec.AsError(err))
		return
	}
	if strings.HasPrefix(p.req.ID, jobs.ItemIDPrefix) {
		g.answer(p, nil, codec.Errorf(codec.CodeBadRequest, "id: ids starting %q are the gateway's own (job items)", jobs.ItemIDPrefix).With("field", "id"))
		return
	}
	if p.req.ID == "" {
		p.req.ID = nuid.Next()
	}
	if tenant != "" {
		// Ids are per tenant (identity.go, rule 3): it runs under the gateway's id for it.
		p.clientID, p.req.ID = p.req.ID, tenantID(tenant, p.req.ID)
	}
	g.submit(p)
}

// submit accepts a decoded and validated request (p.req, whose id is set) for p.op:
// class, deadline, model and pool checks, route check, then the class queue.
func (g *Gateway) submit(p *pending) {
	pools, e := g.resolve(p)
	if e != nil {
		g.answer(p, nil, e)
		return
	}
	if err := g.mapPaths(p, pools); err != nil {
		g.answer(p, nil, err)
		return
	}
	if e := g.fl.admit(p); e != nil {
		g.answer(p, nil, e)
		return
	}
	dropped, err := g.queues.Push(&sched.Item{ID: p.id, Class: p.class, Pools: pools, Deadline: p.deadline, Bytes: p.size, Value: p})
	if err != nil {
		g.answer(p, nil, codec.AsError(err))
		return
	}
	for _, d := range dropped {
		g.answer(d.Value.(*pending), nil, codec.Errorf(codec.CodeOverloaded, "dropped from the full %s queue for a newer request (drop_oldest)", p.class))
	}
	g.failover.record(p, false, nil, nil)
	g.cancelIfAsked(p)
	g.kick()
}

// resolve fills in p's id, class, deadline and default model from the config, checks
// that its class, model and pool exist and fit, and returns the pools that may run it.
func (g *Gateway) resolve(p *pending) ([]string, *codec.Error) {
	p.id = p.req.ID
	p.class = p.req.Class
	if p.class == "" {
		p.class = subjects.ClassInteractive
	}
	cl, ok := g.cfg.Classes[p.class]
	if !ok {
		return nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q (classes: %v)", p.class, g.cfg.ClassNames())
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
		if _, ok := g.cfg.Models[p.req.Model]; !ok {
			return nil, codec.Errorf(codec.CodeUnknownModel, "model %q is not configured", p.req.Model).With("model", p.req.Model)
		}
	}
	if p.req.Pool != "" {
		pc, ok := g.cfg.Pools[p.req.Pool]
		if !ok {
			return nil, codec.Errorf(codec.CodeUnknownPool, "pool %q is not configured (pools: %v)", p.req.Pool, g.cfg.PoolNames()).With("pool", p.req.Pool)
		}
		if !contains(pc.Classes, p.class) {
			return nil, codec.Errorf(codec.CodeBadRequest, "pool %s does not serve class %s", p.req.Pool, p.class).With("pool", p.req.Pool)
		}
	}
	pools := g.candidates(p)
	if len(pools) == 0 && p.req.Device != "" && len(g.poolsFor(g.chainOf(p), p.op, p.req.Model)) > 0 {
		return nil, codec.Errorf(codec.CodeUnknownPool, "no pool of class %s on device %q serves op %s%s", p.class, p.req.Device, p.op, modelSuffix(p.req.Model)).With("device", p.req.Device)
	}
	if len(pools) == 0 {
		return nil, codec.Errorf(codec.CodeUnknownModel, "no pool of class %s loads a model for op %s%s", p.class, p.op, modelSuffix(p.req.Model))
	}
	return pools, nil
}

// cancelIfAsked answers p cancelled, taking it out of its queue, if the client cancelled
// it before it got there.
func (g *Gateway) cancelIfAsked(p *pending) {
	if g.fl.cancelAsked(p) && g.queues.Remove(p.id) != nil {
		g.answer(p, nil, codec.Errorf(codec.CodeCancelled, "cancelled by the client while queued"))
	}
}

func modelSuffix(m string) string {
	if m == "" {
		return ""
	}
	return " (model " + m + ")"
}

// send dispatches one request to pool and handles what comes back. A panic in it
// answers the request internal.
func (g *Gateway) send(p *pending, pool string) {
	defer guard.Recover(g.log, "dispatch", func(e *codec.Error) { g.answer(p, nil, e) })
	item := codec.WorkItem{Request: p.req, Op: p.op, DeadlineUnixMS: p.deadline.UnixMilli(), ClaimTo: g.claimSubject, EnqueuedUnixUS: p.accepted.UnixMicro()}
	item.Class, item.Pool = p.class, pool
	mapRequest(g.cfg.Pools[pool].PathMap, &item.Request) // checked at submit (mapPaths)
	// Past the deadline, give the worker a moment to answer deadline_exceeded itself.
	ctx, cancel := context.WithCancelCause(context.Background())
	ctx, stop := context.WithDeadline(ctx, p.deadline.Add(time.Second))
	defer stop()
	defer cancel(nil)
	direct := g.replyDirect(p, pool)
	var done chan codec.Claim
	if direct {
		done = make(chan codec.Claim, 1)
	}
	attempt, target, ok := g.fl.dispatch(p, pool, cancel, done)
	if !ok {
		g.release(p, pool)
		g.answer(p, nil, codec.Errorf(codec.CodeCancelled, "cancelled by the client while queued"))
		return
	}
	item.Attempt, item.ReplyDirect = attempt, direct
	ct, sent := g.claimTimeout(), time.Now()
	unclaimed := time.AfterFunc(ct, func() {
		if c, cause := g.fl.unclaimed(p, attempt, pool, sent, ct); c != nil {
			c(cause)
		}
	})
	defer unclaimed.Stop()

	// To the worker the dispatch pass chose, or else to the pool's queue group.
	subj, _ := subjects.Infer(pool, p.class)
	if target != "" {
		subj, _ = subjects.InferWorker(pool, p.class, target)
	}
	data, err := codec.Marshal(&item)
	if err != nil {
		g.release(p, pool)
		g.answer(p, nil, codec.Errorf(codec.CodeInternal, "encode work item: %v", err))
		return
	}
	var msg *nats.Msg
	var claim codec.Claim
	if direct {
		claim, err = g.exchangeDirect(ctx, &nats.Msg{Subject: subj, Reply: p.replyTo, Data: data}, done)
	} else {
		msg, err = g.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subj, Data: data})
	}
	g.release(p, pool)
	switch cause := context.Cause(ctx); {
	case err == nil && direct:
		g.repliedDirect(p, claim)
	case err == nil:
		g.forward(p, msg)
	case errors.As(cause, new(*errLost)):
		g.lost(p, cause.(*errLost))
	case errors.As(cause, new(*errUnclaimed)):
		g.redispatch(p, pool)
	case errors.Is(err, nats.ErrNoResponders) && time.Until(p.deadline) > 100*time.Millisecond && g.tracker.HasLive(pool):
		// The pool's workers are alive but not subscribed right now (they resubscribe
		// after a NATS restart): try again shortly rather than fail.
		time.AfterFunc(50*time.Millisecond, func() { g.redispatch(p, pool) })
	case errors.Is(err, nats.ErrNoResponders):
		g.answer(p, nil, codec.Errorf(codec.CodeNoWorker, "no worker is subscribed to %s", subj).With("pools", []string{pool}))
	case errors.Is(err, context.DeadlineExceeded):
		g.answer(p, nil, codec.Errorf(codec.CodeDeadlineExceeded, "no answer from pool %s before the deadline", pool))
	default:
		g.answer(p, nil, codec.Errorf(codec.CodeInternal, "request to %s: %v", subj, err))
	}
}

// replyDirect reports whether the worker is to answer p straight to its client (the item's
// reply subject is the client's, and the worker tells the gateway with a "done" claim):
// a request that came over NATS in msgpack, not a job item, to a pool without a path_map
// (whose output paths the gateway maps back), on a gateway without failover (which keeps
// each answer) and without gateway.relay_replies, whose reply subject is not an import's
// (subjects.IsImportReply: nats-server refuses it as the reply subject of a work item). It saves the reply's leg through the
// gateway; the gateway still owns the request: its deadline, retries after a worker's
// death, cancels, metrics and measured service times.
func (g *Gateway) replyDirect(p *pending, pool string) bool {
	gw := g.cfg.Gateway
	return p.replyTo != "" && !subjects.IsImportReply(p.replyTo) && p.clientID == "" && !p.asJSON && p.owner != ownerJob && len(g.cfg.Pools[pool].PathMap) == 0 && !gw.Failover && !gw.RelayReplies
}

// exchangeDirect publishes a work item whose reply goes to the client, and waits for its
// worker's "done" claim (onClaim), or for ctx to end (a worker's death, no claim, the
// deadline).
func (g *Gateway) exchangeDirect(ctx context.Context, m *nats.Msg, done <-chan codec.Claim) (codec.Claim, error) {
	if err := g.nc.PublishMsg(m); err != nil {
		return codec.Claim{}, err
	}
	select {
	case c := <-done:
		return c, nil
	case <-ctx.Done():
		return codec.Claim{}, ctx.Err()
	}
}

// repliedDirect settles p, whose worker has answered its client itself (claim c, state
// done): what answer does, without sending.
func (g *Gateway) repliedDirect(p *pending, c codec.Claim) {
	g.settle(p, c.Code, func() {
		if c.Code == "" && c.Timing != nil {
			g.observe(p, *c.Timing, p.req.Model)
		}
	})
}

// observe records the worker's timing of a result: in the metrics, and as the measured
// service time of its pool, op and model (what the next one of its kind will cost).
func (g *Gateway) observe(p *pending, t codec.Timing, model string) {
	g.metrics.timing(p, t, model)
	g.est.observe(estKey{p.pool, p.op, p.req.Model}, time.Duration(t.TotalUS-t.QueueUS)*time.Microsecond)
}

// release returns a pool slot and triggers a dispatch pass.
func (g *Gateway) release(p *pending, pool string) {
	g.fl.release(p, pool, g.cfg.Pools[pool].Device)
	g.kick()
}

// forward relays a worker's reply to the client, re-encoded as JSON if the client asked.
func (g *Gateway) forward(p *pending, msg *nats.Msg) {
	if e := reply.ErrorOf(msg); e != nil {
		g.answer(p, nil, e)
		return
	}
	var s codec.Served
	if codec.Unmarshal(msg.Data, &s) == nil {
		g.observe(p, s.Timing, s.Model)
	}
	msg.Data = g.unmapReply(p.op, p.pool, msg.Data) // output paths back to the client's view
	if !p.asJSON && p.clientID == "" {
		g.answer(p, msg.Data, nil)
		return
	}
	rep := codec.NewReply(p.op)
	if err := codec.Unmarshal(msg.Data, rep); err != nil {
		g.answer(p, nil, codec.Errorf(codec.CodeInternal, "worker reply: %v", err))
		return
	}
	if r, ok := rep.(codec.Replier); ok && p.clientID != "" {
		r.Meta().ID = p.clientID // its own id back (identity.go, rule 3)
	}
	b, err := codec.Encode(rep, p.asJSON)
	if err != nil {
		g.answer(p, nil, codec.Errorf(codec.CodeInternal, "encode reply: %v", err))
		return
	}
	g.answer(p, b, nil)
}

// lost handles a request whose worker died holding it: retried once at the front of its
// class queue (inference is idempotent), poison_input after a second death, worker_lost
// when no retry is possible.
func (g *Gateway) lost(p *pending, cause *errLost) {
	if deaths := g.fl.addDeath(p); deaths >= 2 {
		g.answer(p, nil, codec.Errorf(codec.CodePoisonInput, "two workers died holding this request (last: %s); not retried", cause.worker).With("worker", cause.worker))
		return
	}
	if time.Now().After(p.deadline) || !g.retryable(p) {
		g.answer(p, nil, codec.Errorf(codec.CodeWorkerLost, "worker %s died holding this request (%s)", cause.worker, cause.why).With("worker", cause.worker))
		return
	}
	g.metrics.retries.Inc()
	g.queues.PushFront(&sched.Item{ID: p.id, Class: p.class, Pools: g.retryPools(p), Deadline: p.deadline, Bytes: p.size, Value: p})
	g.cancelIfAsked(p)
	g.kick()
}

// redispatch queues a request that no worker claimed again, at the front of its class.
func (g *Gateway) redispatch(p *pending, pool string) {
	g.log.Warn("request not claimed by any worker; dispatching it again", "id", p.id, "pool", pool, "after", g.claimTimeout())
	if !time.Now().Before(p.deadline) {
		g.answer(p, nil, codec.Errorf(codec.CodeDeadlineExceeded, "deadline passed before a worker took the request"))
		return
	}
	g.queues.PushFront(&sched.Item{ID: p.id, Class: p.class, Pools: g.retryPools(p), Deadline: p.deadline, Bytes: p.size, Value: p})
	g.cancelIfAsked(p)
	g.kick()
}

// onDead is called by the tracker when a worker is judged dead: every request it held is
// cancelled with errLost, which sends it to lost.
func (g *Gateway) onDead(id, pool, why string) {
	// A silent local worker is killed first, and its requests retried once it is gone:
	// while it lives its subscription stays in its pool's queue group, and a retry could
	// be delivered to it again.
	g.supervisor.workerDead(id, why)
	others := 0
	for _, w := range g.tracker.Live(pool) {
		if w.HB.Worker != id {
			others++
		}
	}
	for _, l := range g.fl.died(pool, id, why, others) {
		l.cancel(&errLost{worker: id, why: why})
	}
}

// onClaim records which worker holds a request. A claim is dropped unless its body
// names the pool and worker of its subject (ortbus.claim.<gateway>.<pool>.<worker>),
// which under the cluster permissions only that pool's workers may publish; and it only
// counts for the request's current dispatch (its pool and attempt).
func (g *Gateway) onClaim(m *nats.Msg) {
	var c codec.Claim
	ps, err := subjects.Parse(m.Subject)
	switch {
	case err != nil || ps.Kind != subjects.KindClaim:
		g.metrics.bad("claim")
		return
	case codec.Unmarshal(m.Data, &c) != nil:
		g.metrics.bad("claim")
		return
	case c.Pool != ps.Pool || c.Worker != ps.Worker:
		g.metrics.bad("claim")
		return
	}
	g.fl.claim(c)
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
// canCancel). A cancel that may not cancel the request finds nothing, as if the id were
// unknown.
func (g *Gateway) cancelAs(id, by, tenant string) bool {
	id = tenantID(tenant, id) // a tenant names its own ids (identity.go, rule 3)
	if g.fl.mayCancel(id, by) {
		if it := g.queues.Remove(id); it != nil {
			g.answer(it.Value.(*pending), nil, codec.Errorf(codec.CodeCancelled, "cancelled by the client while queued"))
			return true
		}
	}
	p, dispatched, found := g.fl.askCancel(id, by, tenant)
	if !found {
		return false
	}
	if !dispatched {
		// Between queues: out of its queue if it got there meanwhile, else answered
		// where it goes next (cancelIfAsked, send).
		g.cancelIfAsked(p)
		return true
	}
	// Running: the worker holding it stops it (or discards its result) and answers it
	// cancelled, and that answer reaches the client like any other.
	b, _ := codec.Marshal(&codec.Cancel{ID: id})
	if err := g.nc.Publish(subjects.Cancel, b); err != nil {
		g.publishFailed("cancel", err)
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
