package gateway

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/subjects"
)

// The sender carries out the lifecycle's effects (lifecycle.go) on the dispatch loop. It
// decides nothing: each effect says what to send where. What fails to go out comes back
// to the lifecycle as its event (a send that failed, L5). A relayed answer is converted
// for its client (JSON, its own id, paths mapped back) off the loop.

// apply carries out effects, in order.
func (g *Gateway) apply(effects []effect) {
	for _, e := range effects {
		switch e := e.(type) {
		case effRecord:
			g.failover.record(e.p, false, nil, nil)
		case effSend:
			g.sendItem(e)
		case effAnswer:
			g.deliver(e.p, e.pool, e.body, e.err)
		case effRelay:
			g.relaying.Add(1)
			go func() {
				defer g.relaying.Done()
				g.relay(e.p, e.pool, e.msg)
			}()
		case effSettled:
			g.settled(e.p, e.pool, e.claim)
		case effCancel:
			b, _ := codec.Marshal(&codec.Cancel{ID: e.id})
			if err := g.nc.Publish(subjects.Cancel, b); err != nil {
				g.publishFailed("cancel", err)
			}
		case effRetried:
			g.metrics.retries.Inc()
		case effUnclaimed:
			g.log.Warn("request not claimed by any worker; dispatching it again", "id", e.p.id, "pool", e.pool, "after", g.claimTimeout())
		case effWake:
			g.supervisor.wake(e.pool) // a lazy_load pool starts on its first request
		}
	}
}

// sendItem publishes a work item: to the worker the pass chose, or else to the pool's
// queue group; its reply to the gateway's reply inbox under the attempt's token, or
// straight to the client (direct).
func (g *Gateway) sendItem(e effSend) {
	p := e.p
	item := codec.WorkItem{Request: p.req, Op: p.op, DeadlineUnixMS: p.deadline.UnixMilli(), ClaimTo: g.claimSubject, EnqueuedUnixUS: p.accepted.UnixMicro()}
	item.Class, item.Pool, item.Attempt, item.ReplyDirect = p.class, e.pool, e.attempt, e.direct
	mapRequest(g.conf().Pool(e.pool).PathMap, &item.Request) // checked at submit (mapPaths)
	subj, _ := subjects.Infer(e.pool, p.class)
	if e.target != "" {
		subj, _ = subjects.InferWorker(e.pool, p.class, e.target)
	}
	data, err := codec.Marshal(&item)
	if err != nil {
		g.apply(g.lc.sendFailed(p.id, e.attempt, codec.Errorf(codec.CodeInternal, "encode work item: %v", err), time.Now()))
		return
	}
	to := p.replyTo
	if !e.direct {
		to = g.replyInbox + "." + strconv.FormatUint(e.seq, 10)
	}
	if err := g.nc.PublishMsg(&nats.Msg{Subject: subj, Reply: to, Data: data}); err != nil {
		g.apply(g.lc.sendFailed(p.id, e.attempt, codec.Errorf(codec.CodeInternal, "request to %s: %v", subj, err), time.Now()))
	}
}

// onReply takes a relayed reply (or the server's "no responders" status) on the reply
// inbox to the loop. The last token of its subject is the attempt's token.
func (g *Gateway) onReply(m *nats.Msg) {
	tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	seq, err := strconv.ParseUint(tok, 10, 64)
	if err != nil || seq == 0 {
		g.metrics.bad("reply")
		return
	}
	noResp := len(m.Data) == 0 && m.Header.Get("Status") == "503"
	g.post(evReply{seq: seq, msg: m, noResponders: noResp})
}

// deliver sends p's terminal answer (the lifecycle emits exactly one): counted in the
// metrics under pool, sent, and kept for resends (failover.go, rule 4).
func (g *Gateway) deliver(p *pending, pool string, body []byte, err *codec.Error) {
	code := codec.Code("")
	if err != nil {
		code = err.Code
	}
	if !g.end(p, pool, code) {
		return
	}
	p.reply(body, err)
	g.failover.record(p, true, body, err)
}

// settled ends p, whose worker answered its client itself (claim c, state done): what
// deliver does, without sending.
func (g *Gateway) settled(p *pending, pool string, c codec.Claim) {
	if g.end(p, pool, c.Code) && c.Code == "" && c.Timing != nil {
		g.observe(p, pool, *c.Timing, p.req.Model)
	}
}

// end marks p answered with code ("" for a result) and counts it in the metrics under
// pool; false for a second end, which would be a bug of the lifecycle: logged, and
// nothing is sent.
func (g *Gateway) end(p *pending, pool string, code codec.Code) bool {
	if !p.answered.CompareAndSwap(false, true) {
		g.log.Error("a second answer to a request dropped", "id", p.id)
		return false
	}
	label := "ok"
	if code != "" {
		label = string(code)
	}
	g.metrics.observe(p, pool, label)
	return true
}

// observe records the worker's timing of a result: in the metrics, and as the measured
// service time of its pool, op and model (what the next one of its kind will cost).
func (g *Gateway) observe(p *pending, pool string, t codec.Timing, model string) {
	g.metrics.timing(p, pool, t, model)
	g.est.observe(estKey{pool, p.op, p.req.Model}, time.Duration(t.TotalUS-t.QueueUS)*time.Microsecond)
}

// relay answers p with its worker's reply from pool, re-encoded as JSON if the client
// asked, with its own id back (identity.go, rule 3) and output paths mapped back to the
// client's view. A panic in it answers internal.
func (g *Gateway) relay(p *pending, pool string, msg *nats.Msg) {
	defer guard.Recover(g.log, "relay", func(e *codec.Error) { g.deliver(p, pool, nil, e) })
	if e := reply.ErrorOf(msg); e != nil {
		g.deliver(p, pool, nil, e)
		return
	}
	var s codec.Served
	if codec.Unmarshal(msg.Data, &s) == nil {
		g.observe(p, pool, s.Timing, s.Model)
	}
	data := g.unmapReply(p.op, pool, msg.Data) // output paths back to the client's view
	if !p.asJSON && p.clientID == "" {
		g.deliver(p, pool, data, nil)
		return
	}
	rep := codec.NewReply(p.op)
	if err := codec.Unmarshal(data, rep); err != nil {
		g.deliver(p, pool, nil, codec.Errorf(codec.CodeInternal, "worker reply: %v", err))
		return
	}
	if r, ok := rep.(codec.Replier); ok && p.clientID != "" {
		r.Meta().ID = p.clientID // its own id back (identity.go, rule 3)
	}
	b, err := codec.Encode(rep, p.asJSON)
	if err != nil {
		g.deliver(p, pool, nil, codec.Errorf(codec.CodeInternal, "encode reply: %v", err))
		return
	}
	g.deliver(p, pool, b, nil)
}
