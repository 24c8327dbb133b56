package gateway

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
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
	once     sync.Once

	// Guarded by Gateway.mu.
	attempt int    // dispatches so far
	deaths  int    // holders that died with it
	pool    string // where it is in flight ("" while queued)
	worker  string // the claiming worker, once known
	cancel  context.CancelCauseFunc
}

// errLost is the cause of an in-flight request's cancellation when its worker died.
type errLost struct{ worker, why string }

func (e *errLost) Error() string { return "worker " + e.worker + " lost: " + e.why }

// answer sends the terminal reply once; later calls are ignored. It also clears the
// request from the in-flight table.
func (g *Gateway) answer(p *pending, body []byte, err *codec.Error) {
	p.once.Do(func() {
		g.mu.Lock()
		delete(g.inflight, p.id)
		g.mu.Unlock()
		outcome := "ok"
		if err != nil {
			outcome = string(err.Code)
		}
		g.metrics.observe(p, outcome)
		p.reply(body, err)
	})
}

// submit accepts a client request for op: decode, validate, route check, queue.
func (g *Gateway) submit(op string, data []byte, asJSON bool, reply Reply) {
	p := &pending{op: op, asJSON: asJSON, accepted: time.Now(), reply: reply}
	if err := codec.Decode(data, &p.req, asJSON); err != nil {
		g.answer(p, nil, codec.AsError(err))
		return
	}
	p.id = p.req.ID
	if p.id == "" {
		p.id = nuid.Next()
		p.req.ID = p.id
	}
	p.class = p.req.Class
	if p.class == "" {
		p.class = subjects.ClassInteractive
	}
	cl, ok := g.cfg.Classes[p.class]
	if !ok {
		g.answer(p, nil, codec.Errorf(codec.CodeBadRequest, "unknown class %q (classes: %v)", p.class, g.cfg.ClassNames()))
		return
	}
	timeout := cl.Timeout.D()
	if p.req.TimeoutMS > 0 {
		timeout = min(time.Duration(p.req.TimeoutMS)*time.Millisecond, cl.MaxTimeout.D())
	}
	p.deadline = p.accepted.Add(timeout)
	if p.req.Model == "" {
		p.req.Model = cl.Models[op]
	}
	if p.req.Model != "" {
		if _, ok := g.cfg.Models[p.req.Model]; !ok {
			g.answer(p, nil, codec.Errorf(codec.CodeUnknownModel, "model %q is not configured", p.req.Model).With("model", p.req.Model))
			return
		}
	}
	pools := cl.Chain
	if p.req.Pool != "" {
		pc, ok := g.cfg.Pools[p.req.Pool]
		if !ok {
			g.answer(p, nil, codec.Errorf(codec.CodeUnknownPool, "pool %q is not configured (pools: %v)", p.req.Pool, g.cfg.PoolNames()).With("pool", p.req.Pool))
			return
		}
		if !contains(pc.Classes, p.class) {
			g.answer(p, nil, codec.Errorf(codec.CodeBadRequest, "pool %s does not serve class %s", p.req.Pool, p.class).With("pool", p.req.Pool))
			return
		}
		pools = []string{p.req.Pool}
	}
	pools = g.poolsFor(pools, op, p.req.Model)
	if len(pools) == 0 {
		g.answer(p, nil, codec.Errorf(codec.CodeUnknownModel, "no pool of class %s loads a model for op %s%s", p.class, op, modelSuffix(p.req.Model)))
		return
	}
	if err := g.mapPaths(p, pools); err != nil {
		g.answer(p, nil, err)
		return
	}
	g.mu.Lock()
	g.inflight[p.id] = p
	g.mu.Unlock()
	dropped, err := g.queues.Push(&sched.Item{ID: p.id, Class: p.class, Pools: pools, Deadline: p.deadline, Value: p})
	if err != nil {
		g.answer(p, nil, codec.AsError(err))
		return
	}
	if dropped != nil {
		g.answer(dropped.Value.(*pending), nil, codec.Errorf(codec.CodeOverloaded, "dropped from the full %s queue for a newer request (drop_oldest)", p.class))
	}
	g.kick()
}

func modelSuffix(m string) string {
	if m == "" {
		return ""
	}
	return " (model " + m + ")"
}

// send dispatches one request to pool and handles what comes back.
func (g *Gateway) send(p *pending, pool string) {
	item := codec.WorkItem{Request: p.req, Op: p.op, DeadlineUnixMS: p.deadline.UnixMilli(), ClaimTo: g.claimSubject, EnqueuedUnixUS: p.accepted.UnixMicro()}
	item.Class, item.Pool = p.class, pool
	if mapped, ok := g.mapped(p, pool); ok {
		item.Path = mapped
	}
	g.mu.Lock()
	p.attempt++
	item.Attempt = p.attempt
	p.pool, p.worker = pool, ""
	// Past the deadline, give the worker a moment to answer deadline_exceeded itself.
	ctx, cancel := context.WithCancelCause(context.Background())
	ctx, stop := context.WithDeadline(ctx, p.deadline.Add(time.Second))
	p.cancel = cancel
	g.mu.Unlock()
	defer stop()

	subj, _ := subjects.Infer(pool, p.class)
	data, err := codec.Marshal(&item)
	if err != nil {
		g.release(p, pool)
		g.answer(p, nil, codec.Errorf(codec.CodeInternal, "encode work item: %v", err))
		return
	}
	msg, err := g.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: subj, Data: data})
	g.release(p, pool)
	switch cause := context.Cause(ctx); {
	case err == nil:
		g.forward(p, msg)
	case errors.As(cause, new(*errLost)):
		g.lost(p, cause.(*errLost))
	case errors.Is(err, nats.ErrNoResponders):
		g.answer(p, nil, codec.Errorf(codec.CodeNoWorker, "no worker is subscribed to %s", subj).With("pools", []string{pool}))
	case errors.Is(err, context.DeadlineExceeded):
		g.answer(p, nil, codec.Errorf(codec.CodeDeadlineExceeded, "no answer from pool %s before the deadline", pool))
	default:
		g.answer(p, nil, codec.Errorf(codec.CodeInternal, "request to %s: %v", subj, err))
	}
}

// release returns a pool slot and triggers a dispatch pass.
func (g *Gateway) release(p *pending, pool string) {
	g.mu.Lock()
	g.busy[pool]--
	p.cancel = nil
	g.mu.Unlock()
	g.kick()
}

// forward relays a worker's reply to the client, re-encoded as JSON if the client asked.
func (g *Gateway) forward(p *pending, msg *nats.Msg) {
	if code := msg.Header.Get(codec.HeaderErrorCode); code != "" {
		var e codec.Error
		if err := codec.Unmarshal(msg.Data, &e); err != nil || !e.Code.Known() {
			n, _ := strconv.Atoi(code)
			e = codec.Error{Code: codec.CodeInternal, Message: msg.Header.Get(codec.HeaderError), Details: map[string]any{"status": n}}
		}
		g.answer(p, nil, &e)
		return
	}
	if !p.asJSON {
		g.metrics.timing(p, msg.Data)
		g.answer(p, msg.Data, nil)
		return
	}
	rep := codec.NewReply(p.op)
	if err := codec.Unmarshal(msg.Data, rep); err != nil {
		g.answer(p, nil, codec.Errorf(codec.CodeInternal, "worker reply: %v", err))
		return
	}
	b, err := codec.Encode(rep, true)
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
	g.mu.Lock()
	p.deaths++
	deaths := p.deaths
	g.mu.Unlock()
	if deaths >= 2 {
		g.answer(p, nil, codec.Errorf(codec.CodePoisonInput, "two workers died holding this request (last: %s); not retried", cause.worker).With("worker", cause.worker))
		return
	}
	if time.Now().After(p.deadline) || !g.retryable(p) {
		g.answer(p, nil, codec.Errorf(codec.CodeWorkerLost, "worker %s died holding this request (%s)", cause.worker, cause.why).With("worker", cause.worker))
		return
	}
	g.metrics.retries.Inc()
	g.queues.PushFront(&sched.Item{ID: p.id, Class: p.class, Pools: g.retryPools(p), Deadline: p.deadline, Value: p})
	g.kick()
}

// onDead is called by the tracker when a worker is judged dead: every request it held is
// cancelled with errLost, which sends it to lost.
func (g *Gateway) onDead(id, pool, why string) {
	g.mu.Lock()
	var hit []*pending
	others := 0
	for _, w := range g.tracker.Live(pool) {
		if w.HB.Worker != id {
			others++
		}
	}
	for _, p := range g.inflight {
		if p.cancel == nil || p.pool != pool {
			continue
		}
		// A request held by the dead worker; or, when the pool has no other live
		// worker, one dispatched there whose claim had not arrived yet.
		if p.worker == id || (p.worker == "" && others == 0) {
			hit = append(hit, p)
		}
	}
	g.mu.Unlock()
	for _, p := range hit {
		p.cancel(&errLost{worker: id, why: why})
	}
	g.supervisor.workerDead(id, why)
}

// onClaim records which worker holds a request.
func (g *Gateway) onClaim(c codec.Claim) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p, ok := g.inflight[c.ID]; ok && p.attempt == c.Attempt && p.pool == c.Pool {
		p.worker = c.Worker
	}
}

// cancelRequest cancels a queued or in-flight request by id.
func (g *Gateway) cancelRequest(id string) bool {
	if it := g.queues.Remove(id); it != nil {
		g.answer(it.Value.(*pending), nil, codec.Errorf(codec.CodeCancelled, "cancelled by the client while queued"))
		return true
	}
	g.mu.Lock()
	_, ok := g.inflight[id]
	g.mu.Unlock()
	if !ok {
		return false
	}
	// Running: the worker holding it stops it (or discards its result) and answers it
	// cancelled, and that answer reaches the client like any other.
	b, _ := codec.Marshal(&codec.Cancel{ID: id})
	g.nc.Publish(subjects.Cancel, b)
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
