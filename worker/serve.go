package worker

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/subjects"
)

// server is the worker's serving side: its subscriptions (work items, cancels, control
// verbs), the acceptance of each work item into the local queues, and its claims. Its
// rules:
//
//  1. Every message it takes has no reply subject, or one that subjects.CheckReply
//     accepts under the configured reply prefixes (checked). The gateway checked the
//     reply subject of every item it forwards; the worker checks again, since anyone who
//     may publish a work item or a control message chooses its reply subject, and a
//     worker answers with its own rights. A message with any other reply subject is
//     dropped whole (not run, not answered) and counted (bad_messages).
//  2. Acceptance never blocks (it runs on the subscription's goroutine): an item is
//     queued, or answered at once — malformed, unknown model or op, already past its
//     deadline, or its class queue full (overloaded).
//  3. Claims go only to a gateway's claim subject, never where a forged item says.
//  4. A draining worker takes no new work: its work subscriptions drain (ServeConn).
//  5. An item with reply_direct is answered only once its gateway's verdict says the
//     attempt is this worker's (replier, rule 6): its taken claim asks for the verdict,
//     which comes on the worker's verdict subject (verdict).
type server struct {
	cfg      *config.Config
	pool     *config.Pool
	worker   string
	log      *slog.Logger
	models   *modelSet
	q        *queues
	reply    *replier
	ctl      *controller
	snapshot func() *codec.Heartbeat // answers stats and drain
	replies  []string                // the reply prefixes it answers under (config NATS.Replies)

	late        lateClaims // the fault hook's held claims (late.go)
	draining    atomic.Bool
	badMessages atomic.Uint64 // messages dropped for their reply subject (rule 1)
}

// pendingBytes bounds the bytes of work items a subscription holds before the worker
// takes them (with the configured pending_msgs): past it NATS drops items (logged as a
// slow consumer), the gateway sees them unclaimed and dispatches them again; without it
// a flood of large items could grow the worker's memory without bound.
const pendingBytes = 256 << 20

// maxTimeoutMS caps a plain request's timeout_ms (a day), so that the deadline it makes
// never overflows a time.Duration.
const maxTimeoutMS = 24 * 3600 * 1000

// subscribe joins the pool's queue group on infer.<pool>.<class>, and subscribes to the
// worker's own infer.<pool>.<class>.<worker> (where a gateway sends the items it chose
// this worker for), each with the configured per-subscription pending limit and
// pendingBytes.
func (s *server) subscribe(nc *nats.Conn, class string) ([]*nats.Subscription, error) {
	pool, err := subjects.Infer(s.pool.Name, class)
	if err != nil {
		return nil, err
	}
	own, err := subjects.InferWorker(s.pool.Name, class, s.worker)
	if err != nil {
		return nil, err
	}
	handle := s.workHandler(class)
	qs, err := nc.QueueSubscribe(pool, subjects.InferQueue(s.pool.Name), handle)
	if err != nil {
		return nil, err
	}
	subs := []*nats.Subscription{qs}
	ws, err := nc.Subscribe(own, handle)
	if err == nil {
		subs = append(subs, ws)
		for _, sub := range subs {
			if err = sub.SetPendingLimits(s.pool.PendingMsgs, pendingBytes); err != nil {
				break
			}
		}
	}
	if err != nil {
		for _, sub := range subs {
			sub.Unsubscribe()
		}
		return nil, err
	}
	return subs, nil
}

// workHandler is the handler of class's work subscriptions: accept, for the messages the
// worker may answer (rule 1).
func (s *server) workHandler(class string) nats.MsgHandler {
	return s.checked(func(m *nats.Msg) { s.accept(class, m) })
}

// accept decodes a work item and queues it, or answers at once (rule 2). An item whose
// reply goes straight to its client is claimed in both cases, and its answer waits for
// the gateway's verdict (rule 5).
func (s *server) accept(class string, m *nats.Msg) {
	j := &job{msg: m, class: class, asJSON: m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON, received: time.Now(), item: &codec.WorkItem{}}
	j.trace = startTrace(m.Header, j.received, class, s.pool.Name, s.worker, s.pool.Device)
	defer guard.Recover(s.log, "work item", func(e *codec.Error) { s.reply.answer(j, nil, e) })
	err := s.admit(j)
	if err == nil {
		j.ctx, j.cancel = context.WithDeadline(context.Background(), j.deadline)
	}
	gated := j.item.ReplyDirect && j.claim != "" && s.reply.verdictTo != ""
	if gated {
		j.verdict = s.reply.gate.expect(j.item.ID, j.item.Attempt, j.cancel, j.deadline) // before its slot can answer it
	}
	if err == nil && !s.q.put(j) {
		j.cancel()
		err = codec.Errorf(codec.CodeOverloaded, "worker %s: %s queue is full (%d)", s.worker, class, s.pool.QueueBound).With("worker", s.worker).With("class", class)
	}
	if err == nil || gated {
		s.claimTaken(j)
	}
	if err != nil {
		s.reply.answer(j, nil, err)
	}
}

// claimTaken sends j's taken claim — held back by the fault hook (late.go) in chaos
// tests.
func (s *server) claimTaken(j *job) {
	if s.late.hold(j, func() { s.reply.claim(j, codec.ClaimTaken, "", nil) }) {
		return
	}
	s.reply.claim(j, codec.ClaimTaken, "", nil)
}

// admit decodes and validates j's item, checks its claim subject (rule 3), takes its
// model (modelSet.acquire) and sets its deadline; the error is its answer.
func (s *server) admit(j *job) error {
	if err := codec.Decode(j.msg.Data, j.item, j.asJSON); err != nil {
		return err
	}
	if err := j.item.Validate(); err != nil {
		return err
	}
	if j.item.ID == "" {
		j.item.ID = nuid.Next()
	}
	if j.item.ClaimTo != "" {
		var err error
		if j.claim, err = subjects.ClaimFrom(j.item.ClaimTo, s.pool.Name, s.worker); err != nil {
			return codec.Errorf(codec.CodeBadRequest, "%v", err).With("field", "claim_to")
		}
	}
	model, op, err := s.models.acquire(j.item.Model, j.item.Op)
	if err != nil {
		return err
	}
	j.model, j.op = model, op
	j.trace.item(op, model.Name(), j.item.ID, j.item.Attempt, s.models.execProvider())
	j.deadline = j.received.Add(s.cfg.Classes[j.class].Timeout.D())
	if j.item.DeadlineUnixMS > 0 {
		j.deadline = time.UnixMilli(j.item.DeadlineUnixMS)
	} else if j.item.TimeoutMS > 0 {
		j.deadline = j.received.Add(time.Duration(min(j.item.TimeoutMS, maxTimeoutMS)) * time.Millisecond)
	}
	if !time.Now().Before(j.deadline) {
		return codec.Errorf(codec.CodeDeadlineExceeded, "deadline passed before the worker took the request")
	}
	return nil
}

// checked is h for the messages the worker may answer (rule 1). Every subscription of
// the worker goes through it.
func (s *server) checked(h nats.MsgHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
		if m.Reply != "" && subjects.CheckReply(m.Reply, s.replies) != nil {
			s.badMessages.Add(1)
			return
		}
		h(m)
	}
}

// control subscribes to cancels and to this worker's control verbs: stats and drain
// (answered with a heartbeat snapshot), load and unload (the controller: inplace.go).
func (s *server) control(nc *nats.Conn) ([]*nats.Subscription, error) {
	cs, err := nc.Subscribe(subjects.Cancel, guard.Msg(s.log, "cancel", nc, s.replies, s.checked(s.cancel)))
	if err != nil {
		return nil, err
	}
	subs := []*nats.Subscription{cs}
	vs, err := nc.Subscribe(s.reply.verdictTo, guard.Msg(s.log, "verdict", nc, s.replies, s.checked(s.verdict)))
	if err != nil {
		return subs, err
	}
	subs = append(subs, vs)
	for _, verb := range []string{subjects.VerbStats, subjects.VerbDrain, subjects.VerbLoad, subjects.VerbUnload} {
		subj, err := subjects.Worker(s.worker, verb)
		if err != nil {
			return nil, err
		}
		sub, err := nc.Subscribe(subj, guard.Msg(s.log, "control", nc, s.replies, s.checked(func(m *nats.Msg) { s.verb(nc, verb, m) })))
		if err != nil {
			return nil, err
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// cancel takes a cancel: a job queued here is answered cancelled, a running one's
// context cancelled; the cancel's reply (if it asks for one) says it was found.
func (s *server) cancel(m *nats.Msg) {
	var c codec.Cancel
	if codec.Decode(m.Data, &c, m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON) != nil || c.ID == "" {
		return
	}
	j, found := s.q.cancel(c.ID)
	if !found {
		return
	}
	if j != nil {
		s.reply.answer(j, nil, codec.Errorf(codec.CodeCancelled, "cancelled while queued"))
	}
	if m.Reply != "" {
		b, _ := codec.Marshal(&codec.CancelReply{ID: c.ID, Found: true})
		if err := m.Respond(b); err != nil {
			s.reply.publishFailed("cancel reply", c.ID, err)
		}
	}
}

// verdict takes a gateway's verdict on a claim (rule 5). A malformed one changes nothing.
func (s *server) verdict(m *nats.Msg) {
	var v codec.ClaimVerdict
	if codec.Unmarshal(m.Data, &v) != nil || v.ID == "" {
		return
	}
	s.reply.gate.decide(v)
}

// verb takes a control verb: load and unload go to the controller; stats and drain (which
// starts the worker's drain: rule 4) are answered with a heartbeat snapshot.
func (s *server) verb(nc *nats.Conn, verb string, m *nats.Msg) {
	if verb == subjects.VerbLoad || verb == subjects.VerbUnload {
		s.ctl.handle(nc, verb, m)
		return
	}
	if verb == subjects.VerbDrain {
		s.draining.Store(true)
	}
	b, _ := codec.Encode(s.snapshot(), m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON)
	if err := m.Respond(b); err != nil {
		s.reply.publishFailed(verb, "", err)
	}
}
