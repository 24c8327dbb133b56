package gateway

import (
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/subjects"
)

// The sender carries out the lifecycle's effects (lifecycle.go) on the dispatch loop. It
// decides nothing: each effect says what to send where. What fails to go out is returned
// to the loop (carryOut), which gives it to the lifecycle as its event (a send that
// failed, L5): the sender never calls back into the lifecycle. A relayed answer is
// decoded once and converted for its client (JSON, its own id, paths mapped back) off
// the loop.

// sender is the dispatcher's connection to the workers: it publishes work items and
// takes their claims and relayed replies back to the loop (post). The loop (loop.go)
// owns it and calls apply; nothing here reads the loop's state.
type sender struct {
	nc           *nats.Conn
	claimSubject string         // claims come to <claimSubject>.<pool>.<worker>
	replyInbox   string         // relayed replies come to <replyInbox>.<attempt token>
	relaying     sync.WaitGroup // relayed answers being converted

	post       func(event)           // to the loop
	conf       func() *config.Config // the config in force
	log        *slog.Logger
	est        *estimator // measured service times (their own lock)
	metrics    *metrics
	failover   *failover
	supervisor *supervisor
}

// senderDeps are what the sender sends with: this gateway's NATS connection and the
// subject its claims come to, the metrics, failover (the answers kept for resends) and
// the supervisor (a worker's death heard from a failed send).
type senderDeps struct {
	nc           *nats.Conn
	claimSubject string
	metrics      *metrics
	failover     *failover
	supervisor   *supervisor
}

// newSender is the sender of deps, posting to the loop with post; its relayed replies
// come to an inbox of its own on the connection (none without one: unit tests).
func newSender(deps senderDeps, post func(event), conf func() *config.Config, log *slog.Logger, est *estimator) *sender {
	s := &sender{nc: deps.nc, claimSubject: deps.claimSubject, post: post, conf: conf, log: log, est: est,
		metrics: deps.metrics, failover: deps.failover, supervisor: deps.supervisor}
	if s.nc != nil {
		s.replyInbox = s.nc.NewInbox()
	}
	return s
}

// sendFailure is a work item that did not go out (L5).
type sendFailure struct {
	id      string
	attempt int
	err     *codec.Error
}

// apply carries out effects, in order, and returns the sends that failed.
func (s *sender) apply(effects []effect) (failed []sendFailure) {
	for _, e := range effects {
		switch e := e.(type) {
		case effRecord:
			s.failover.record(e.p, false, nil, nil)
		case effSend:
			if err := s.sendItem(e); err != nil {
				failed = append(failed, sendFailure{e.p.id, e.attempt, err})
			}
		case effAnswer:
			s.deliver(e.p, e.pool, e.body, e.err)
		case effRelay:
			s.relaying.Add(1)
			go func() {
				defer s.relaying.Done()
				s.relay(e.p, e.pool, e.msg)
			}()
		case effSettled:
			s.settled(e.p, e.pool, e.claim)
		case effCancel:
			traceCancel(e.p)
			b, _ := codec.Marshal(&codec.Cancel{ID: e.id})
			if err := s.nc.Publish(subjects.Cancel, b); err != nil {
				s.metrics.publishFailed("cancel", err)
			}
		case effRetried:
			s.metrics.retries.Inc()
			traceRequeued(e.p, "worker lost")
		case effUnclaimed:
			traceRequeued(e.p, "unclaimed")
			s.log.Warn("request not claimed by any worker; dispatching it again", "id", e.p.id, "pool", e.pool, "after", claimTimeout(s.conf()))
		case effWake:
			s.supervisor.wake(e.pool) // a lazy_load pool starts on its first request
		case effVerdict:
			b, _ := codec.Marshal(&e.v)
			if err := s.nc.Publish(e.to, b); err != nil {
				s.metrics.publishFailed("verdict", err)
			}
		}
	}
	return failed
}

// sendItem publishes a work item: to the worker the pass chose, or else to the pool's
// queue group; its reply to the gateway's reply inbox under the attempt's token, or
// straight to the client (direct). The error is the send's failure (L5).
func (s *sender) sendItem(e effSend) *codec.Error {
	p := e.p
	item := codec.WorkItem{Request: p.req, Op: p.op, DeadlineUnixMS: p.deadline.UnixMilli(), ClaimTo: s.claimSubject, EnqueuedUnixUS: p.accepted.UnixMicro()}
	item.Class, item.Pool, item.Attempt, item.ReplyDirect = p.class, e.pool, e.attempt, e.direct
	mapRequest(s.conf().Pool(e.pool).PathMap, &item.Request) // checked at submit (mapPaths)
	subj, _ := subjects.Infer(e.pool, p.class)
	if e.target != "" {
		subj, _ = subjects.InferWorker(e.pool, p.class, e.target)
	}
	data, err := codec.Marshal(&item)
	if err != nil {
		return codec.Errorf(codec.CodeInternal, "encode work item: %v", err)
	}
	to := p.replyTo
	if !e.direct {
		to = s.replyInbox + "." + strconv.FormatUint(e.seq, 10)
	}
	msg := &nats.Msg{Subject: subj, Reply: to, Data: data}
	traceSend(p, e, s.conf, msg)
	if err := s.nc.PublishMsg(msg); err != nil {
		return codec.Errorf(codec.CodeInternal, "request to %s: %v", subj, err)
	}
	return nil
}

// onReply takes a relayed reply (or the server's "no responders" status) on the reply
// inbox to the loop. The last token of its subject is the attempt's token.
func (s *sender) onReply(m *nats.Msg) {
	tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	seq, err := strconv.ParseUint(tok, 10, 64)
	if err != nil || seq == 0 {
		s.metrics.bad("reply")
		return
	}
	noResp := len(m.Data) == 0 && m.Header.Get("Status") == "503"
	s.post(evReply{seq: seq, msg: m, noResponders: noResp})
}

// deliver sends p's terminal answer (the lifecycle emits exactly one; a request refused
// before the loop took it gets it here): counted in the metrics under pool, sent, and
// kept for resends (failover.go, rule 4).
func (s *sender) deliver(p *pending, pool string, body []byte, err *codec.Error) {
	code := codec.Code("")
	if err != nil {
		code = err.Code
	}
	if !s.end(p, pool, code) {
		return
	}
	p.reply(body, err)
	s.failover.record(p, true, body, err)
}

// settled ends p, whose worker answered its client itself (claim c, state done): what
// deliver does, without sending.
func (s *sender) settled(p *pending, pool string, c codec.Claim) {
	traceServed(p, codec.Served{Worker: c.Worker})
	if s.end(p, pool, c.Code) && c.Code == "" && c.Timing != nil {
		s.observe(p, pool, *c.Timing, p.req.Model)
	}
}

// end marks p answered with code ("" for a result) and counts it in the metrics under
// pool; false for a second end, which would be a bug of the lifecycle: logged, and
// nothing is sent.
func (s *sender) end(p *pending, pool string, code codec.Code) bool {
	if !p.answered.CompareAndSwap(false, true) {
		s.log.Error("a second answer to a request dropped", "id", p.id)
		return false
	}
	traceEnd(p, pool, code)
	label := "ok"
	if code != "" {
		label = string(code)
	}
	s.metrics.observe(p, pool, label)
	return true
}

// observe records the worker's timing of a result: in the metrics, and as the measured
// service time of its pool, op and model (what the next one of its kind will cost).
func (s *sender) observe(p *pending, pool string, t codec.Timing, model string) {
	s.metrics.timing(p, pool, t, model)
	s.est.observe(estKey{pool, p.op, p.req.Model}, time.Duration(t.TotalUS-t.QueueUS)*time.Microsecond)
}

// relay answers p with its worker's reply from pool. The reply is decoded once: its
// timing observed, its output paths mapped back to the client's view, its own id given
// back (account.go, rule 3), and re-encoded (as JSON if the client asked) only when
// something changed; a reply the client can take as it is goes out as it came. A panic
// in it answers internal.
func (s *sender) relay(p *pending, pool string, msg *nats.Msg) {
	defer guard.Recover(s.log, "relay", func(e *codec.Error) { s.deliver(p, pool, nil, e) })
	if e := reply.ErrorOf(msg); e != nil {
		s.deliver(p, pool, nil, e)
		return
	}
	rep, ok := codec.NewReply(p.op).(codec.Replier)
	if ok && codec.Unmarshal(msg.Data, rep) != nil {
		ok = false
	}
	if !ok {
		if !p.asJSON && p.clientID == "" {
			s.deliver(p, pool, msg.Data, nil) // nothing to convert: the client reads it
		} else {
			s.deliver(p, pool, nil, codec.Errorf(codec.CodeInternal, "worker reply to %s does not decode", p.op))
		}
		return
	}
	meta := rep.Meta()
	traceServed(p, *meta)
	s.observe(p, pool, meta.Timing, meta.Model)
	changed := unmapPaths(s.conf().Pool(pool).PathMap, rep) // output paths back to the client's view
	if p.clientID != "" {
		meta.ID, changed = p.clientID, true // its own id back (account.go, rule 3)
	}
	if !changed && !p.asJSON {
		s.deliver(p, pool, msg.Data, nil)
		return
	}
	b, err := codec.Encode(rep, p.asJSON)
	if err != nil {
		s.deliver(p, pool, nil, codec.Errorf(codec.CodeInternal, "encode reply: %v", err))
		return
	}
	s.deliver(p, pool, b, nil)
}

// onClaim records which worker holds a request. A claim is dropped unless its body
// names the pool and worker of its subject (ortbus.claim.<gateway>.<pool>.<worker>),
// which under the cluster permissions only that pool's workers may publish, and its reply
// subject, if any, is that worker's verdict subject (ortbus.worker.<worker>.verdict: the
// gateway publishes nowhere a claim chooses); and it only counts for the request's
// current dispatch (its pool and attempt).
func (s *sender) onClaim(m *nats.Msg) {
	var c codec.Claim
	ps, err := subjects.Parse(m.Subject)
	if err != nil || ps.Kind != subjects.KindClaim || codec.Unmarshal(m.Data, &c) != nil || c.Pool != ps.Pool || c.Worker != ps.Worker {
		s.metrics.bad("claim")
		return
	}
	if m.Reply != "" {
		if want, err := subjects.Worker(c.Worker, subjects.VerbVerdict); err != nil || m.Reply != want {
			s.metrics.bad("claim")
			return
		}
	}
	s.post(evClaim{c, m.Reply})
}
