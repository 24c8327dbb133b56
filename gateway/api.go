package gateway

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/subjects"
	"github.com/ortbus/ortbus/telemetry"
)

// Version is the gateway's service version, shown by `nats micro info ortbus`.
const Version = "0.1.0"

// serveAPI registers the client API as the micro service `ortbus` in the queue group
// ortbus-gateway, one endpoint per op on ortbus.v1.<op>, and the operators' cancel on
// ortbus.ops.cancel.
func (g *Gateway) serveAPI() error {
	svc, err := micro.AddService(g.nc, micro.Config{
		Name:        subjects.ServiceName,
		Version:     Version,
		Description: "ortbus: ONNX Runtime inference routed to resident workers",
		QueueGroup:  subjects.GatewayQueue,
		Metadata:    map[string]string{"gateway": g.id},
	})
	if err != nil {
		return err
	}
	g.svc = svc
	// Pending limits: a burst of requests waits in the subscription (up to 64 Ki
	// messages or apiPendingBytes), not in an unbounded buffer.
	limits := micro.WithEndpointPendingLimits(65536, apiPendingBytes)
	grp := svc.AddGroup(subjects.APIPrefix)
	for _, op := range subjects.Ops {
		op := op
		if err := grp.AddEndpoint(op, micro.HandlerFunc(func(r micro.Request) { g.handle(op, r, false) }), limits); err != nil {
			return err
		}
	}
	for _, op := range append(slices.Clip(subjects.JobOps), subjects.CacheOps...) {
		op := op
		// Endpoint names may not hold dots: job.submit is served as job-submit on
		// ortbus.v1.job.submit.
		name := strings.ReplaceAll(op, ".", "-")
		if err := grp.AddEndpoint(name, micro.HandlerFunc(func(r micro.Request) { g.handle(op, r, false) }), limits, micro.WithEndpointSubject(op)); err != nil {
			return err
		}
	}
	if err := svc.AddEndpoint("ops-cancel", micro.HandlerFunc(func(r micro.Request) { g.handle(subjects.OpCancel, r, true) }),
		micro.WithEndpointSubject(subjects.OpsCancel), limits); err != nil {
		return err
	}
	return g.reloader.serve(svc)
}

// apiPendingBytes bounds the bytes of requests waiting in each API subscription.
const apiPendingBytes = 256 << 20

// handle serves one micro request (ops: it came on the operators' subject). It never
// blocks: inference ops are queued and answered later from the dispatcher. A panic in it
// is answered internal; a reply too large for the bus is answered reply_too_large; a
// reply that cannot be sent is counted and logged.
func (g *Gateway) handle(op string, r micro.Request, ops bool) {
	cfg := g.conf()
	if to := r.Reply(); to != "" && subjects.CheckReply(to, cfg.NATS.Replies()) != nil {
		// The reply subject is input too (subjects.CheckReply): one that is not a
		// requester's inbox is never answered nor forwarded to a worker, so that no
		// request makes the gateway publish with its own rights to a subject the
		// requester chose (JetStream's API, ortbus.ops.cancel, 4 KB of subject that would
		// close the gateway's connection). Dropped before anything can answer it.
		g.metrics.bad("reply_subject")
		return
	}
	asJSON := r.Headers().Get(codec.HeaderContentType) == codec.ContentTypeJSON
	var once sync.Once
	reply := func(body []byte, e *codec.Error) {
		once.Do(func() {
			if err := respond(r, asJSON, body, e, g.nc.MaxPayload()); err != nil {
				g.metrics.publishFailed("reply", err)
			}
		})
	}
	defer guard.Recover(g.log, "api "+op, func(e *codec.Error) { reply(nil, e) })
	if r.Reply() == "" && !ops {
		// Published without a reply subject: nobody to answer, and no owner to check.
		g.metrics.bad("request")
		return
	}
	account := accountOf(cfg, r.Headers())
	by := r.Reply()
	switch {
	case ops:
		by = "" // an operator may cancel any request
	case account != "":
		// Across a service import the reply subject is _R_.<prefix>.<n>, whose prefix is
		// the exporting account's on the requester's server: shared by every importing
		// account (and another on another server). It names no owner; the account does.
		by = accountOwner(account)
	}
	if r.Headers().Get(codec.HeaderResend) != "" && subjects.IsWork(op) {
		// A client's resend after a gateway died (failover.go, rule 3).
		var req codec.Request
		if codec.Decode(r.Data(), &req, asJSON) == nil && codec.CheckID("id", req.ID) == nil &&
			g.failover.resent(r, accountScopedID(account, req.ID), ownerOf(by), reply) {
			return
		}
	}
	g.serveFrom(telemetry.Extract(context.Background(), r.Headers()), op, r.Data(), asJSON, r.Reply(), by, account, reply)
}

// serve dispatches one request of op from HTTP, sent by account ("" the operator:
// httpcaller.go); ctx carries the trace context of its headers (telemetry.ExtractHTTP).
func (g *Gateway) serve(ctx context.Context, op string, data []byte, asJSON bool, account string, reply Reply) {
	g.serveFrom(ctx, op, data, asJSON, "", httpOwner(account), account, reply)
}

// httpOwner is who sent an HTTP request of account, for cancel's ownership check: the
// HTTP API for the operator, the account itself for an account (as over NATS).
func httpOwner(account string) string {
	if account == "" {
		return ownerHTTP
	}
	return accountOwner(account)
}

// serveFrom dispatches one request of op. replyTo is its NATS reply subject ("" over
// HTTP); by is who sent it, for cancel's ownership check (see canCancel): its reply
// subject, ownerHTTP, or "" for an operator; account owns its jobs and leases and is
// bounded on its own (account.go).
func (g *Gateway) serveFrom(ctx context.Context, op string, data []byte, asJSON bool, replyTo, by, account string, reply Reply) {
	encode := func(v any) {
		b, err := codec.Encode(v, asJSON)
		if err != nil {
			reply(nil, codec.Errorf(codec.CodeInternal, "%v", err))
			return
		}
		reply(b, nil)
	}
	switch {
	case op == subjects.OpStatus:
		encode(g.status(account))
	case op == subjects.OpHealth:
		encode(g.health())
	case op == subjects.OpCancel:
		var c codec.Cancel
		if err := codec.Decode(data, &c, asJSON); err != nil {
			reply(nil, codec.AsError(err))
			return
		}
		if err := codec.CheckID("id", c.ID); err != nil {
			reply(nil, codec.Errorf(codec.CodeBadRequest, "cancel needs {id}: %v", err).With("field", "id"))
			return
		}
		encode(&codec.CancelReply{ID: c.ID, Found: g.d.cancelAs(c.ID, by, account)})
	case subjects.IsWork(op):
		g.submitFrom(ctx, op, data, asJSON, replyTo, ownerOf(by), account, reply)
	case op == subjects.OpLease:
		var req codec.LeaseRequest
		if err := codec.Decode(data, &req, asJSON); err != nil {
			reply(nil, codec.AsError(err))
			return
		}
		// Answered now, or later by the waiting leases (leasewait.go).
		g.budget.serveLease(g.conf(), &req, account, func(l *codec.LeaseReply, e *codec.Error) {
			if e != nil {
				reply(nil, e)
				return
			}
			encode(l)
		})
	case op == subjects.OpPause:
		var req codec.PauseRequest
		if err := codec.Decode(data, &req, asJSON); err != nil {
			reply(nil, codec.AsError(err))
			return
		}
		pr, e := g.pauses.pause(g.conf(), &req, account)
		if e != nil {
			reply(nil, e)
			return
		}
		encode(pr)
	case slices.Contains(subjects.JobOps, op):
		g.jobs.serve(op, data, asJSON, account, reply)
	case slices.Contains(subjects.CacheOps, op):
		g.cache.serve(op, data, asJSON, account, reply)
	default:
		reply(nil, codec.Errorf(codec.CodeUnknownOp, "unknown op %q", op))
	}
}

// health is ok when every configured pool has a live worker.
func (g *Gateway) health() *codec.HealthReply {
	cfg := g.conf()
	h := &codec.HealthReply{Status: "ok", Pools: len(cfg.Pools)}
	for _, pool := range cfg.PoolNames() {
		n := len(g.tracker.Live(pool))
		h.Workers += n
		if n == 0 {
			h.Status = "degraded"
		}
	}
	return h
}

// status is the whole system as this gateway sees it, as account may see it: an account sees
// its own leases (holders and ids) and the pauses that hold its work; others' leases only
// in the devices' figures (lease.go, rule 4; pause.go, rule 6). The local owner ("")
// sees every lease and pause.
func (g *Gateway) status(account string) *codec.StatusReply {
	cfg := g.conf()
	st := &codec.StatusReply{Gateway: g.id, AllowedRoots: cfg.Security.AllowedRoots, SpoolDir: cfg.Security.SpoolDir, Devices: g.budget.deviceStatus(cfg)}
	now := time.Now()
	for i := range st.Devices {
		if account != "" {
			st.Devices[i].Leases = g.budget.leases.ownedBy(st.Devices[i].Device, account)
		}
		st.Devices[i].DriverUsedBytes = g.driver.latest(st.Devices[i].Device, now)
	}
	for _, name := range cfg.PoolNames() {
		pc := cfg.Pools[name]
		ps := codec.PoolStatus{Name: name, EP: pc.EP, Device: pc.Device, Local: pc.IsLocal(), Classes: pc.Classes, Workers: pc.Workers, Live: len(g.tracker.Live(name))}
		ps.CrashLooping, ps.Error = g.supervisor.poolInfo(name)
		ps.Loading, ps.Skipped = g.supervisor.modelsInfo(name)
		ps.Unloaded = g.reloader.unloaded(cfg, name)
		st.Pools = append(st.Pools, ps)
	}
	for _, w := range g.tracker.Workers() {
		ws := codec.WorkerStatus{Heartbeat: w.HB, HeartbeatAgeMS: now.Sub(w.Seen).Milliseconds()}
		// The ids a worker holds are other clients' requests (and cancel capabilities):
		// status, which every client may ask, gives only their number. Operators see
		// them in the heartbeats (ortbus.hb.>, which the client role cannot read).
		ws.HeldCount, ws.Held = len(ws.Held), nil
		if w.Dead {
			ws.State = "dead"
			ws.LastExit = w.Why
		}
		if ps, ok := g.supervisor.status(w.HB.Worker); ok {
			ws.Restarts = ps.restarts
			if ps.lastExit != "" {
				ws.LastExit = ps.lastExit
			}
			if w.Dead && ps.asleep {
				// Stopped by keep_alive, not lost: the pool wakes on its next request.
				ws.State, ws.LastExit = "asleep", "stopped after keep_alive idle; starts again on the next request"
			}
		}
		st.Workers = append(st.Workers, ws)
	}
	st.Pauses = g.pauses.list(pauseNow(), account)
	if g.gates != nil {
		st.Gates = g.gates.list(now)
	}
	var running map[string]int
	g.d.inspect(func(lc *lifecycle) { running = lc.running() })
	for _, name := range cfg.ClassNames() {
		cl := cfg.Classes[name]
		cs := codec.ClassStatus{Name: name, Priority: cl.Priority, Queued: g.d.queues.Len(name), Running: running[name], Bound: cl.QueueBound, Chain: cl.Chain}
		if g.metrics != nil && g.metrics.window != nil {
			g.metrics.window.fill(&cs)
		}
		st.Classes = append(st.Classes, cs)
	}
	return st
}

// submitFrom accepts a client request for op: decode, validate, route check, queue.
// ctx carries the trace context its headers gave (telemetry.Extract); replyTo is its NATS
// reply subject ("" over HTTP), owner who may cancel it, account whose bound it counts in
// (account.go).
func (g *Gateway) submitFrom(ctx context.Context, op string, data []byte, asJSON bool, replyTo, owner, account string, reply Reply) {
	p := &pending{op: op, asJSON: asJSON, accepted: time.Now(), reply: reply, replyTo: replyTo, owner: owner, account: account, size: int64(len(data))}
	traceStart(ctx, p)
	if e := decodeRequest(data, asJSON, &p.req); e != nil {
		g.d.deliver(p, "", nil, e)
		return
	}
	if p.req.ID == "" {
		p.req.ID = nuid.Next()
	}
	if account != "" {
		// Ids are per account (account.go, rule 3): it runs under the gateway's id for it.
		p.clientID, p.req.ID = p.req.ID, accountScopedID(account, p.req.ID)
	}
	if g.cache.front(p) {
		return // looked up in the result cache first (cache.go), then submitted
	}
	g.d.submit(p)
}
