package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/internal/fault"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/models"
	"github.com/ortbus/ortbus/ort"
	"github.com/ortbus/ortbus/subjects"
)

// pendingBytes bounds the bytes of work items a subscription holds before the worker
// takes them (with the configured pending_msgs): past it NATS drops items (logged as a
// slow consumer), the gateway sees them unclaimed and dispatches them again; without it
// a flood of large items could grow the worker's memory without bound.
const pendingBytes = 256 << 20

// subscribe joins the pool's queue group on infer.<pool>.<class>, and subscribes to the
// worker's own infer.<pool>.<class>.<worker> (where a gateway sends the items it chose
// this worker for), each with the configured per-subscription pending limit and
// pendingBytes.
func (w *Worker) subscribe(nc *nats.Conn, class string) ([]*nats.Subscription, error) {
	pool, err := subjects.Infer(w.pool.Name, class)
	if err != nil {
		return nil, err
	}
	own, err := subjects.InferWorker(w.pool.Name, class, w.id)
	if err != nil {
		return nil, err
	}
	handle := w.workHandler(class)
	qs, err := nc.QueueSubscribe(pool, subjects.InferQueue(w.pool.Name), handle)
	if err != nil {
		return nil, err
	}
	subs := []*nats.Subscription{qs}
	ws, err := nc.Subscribe(own, handle)
	if err == nil {
		subs = append(subs, ws)
		for _, s := range subs {
			if err = s.SetPendingLimits(w.pool.PendingMsgs, pendingBytes); err != nil {
				break
			}
		}
	}
	if err != nil {
		for _, s := range subs {
			s.Unsubscribe()
		}
		return nil, err
	}
	return subs, nil
}

// workHandler is the handler of class's work subscriptions: accept, for the messages the
// worker may answer (checked).
func (w *Worker) workHandler(class string) nats.MsgHandler {
	return w.checked(func(m *nats.Msg) { w.accept(class, m) })
}

// accept decodes a work item and queues it, or answers at once: malformed, unknown model
// or op, already past its deadline, or its class queue full (overloaded). It runs on the
// subscription's goroutine, so it never blocks.
func (w *Worker) accept(class string, m *nats.Msg) {
	asJSON := m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON
	j := &job{msg: m, class: class, asJSON: asJSON, received: time.Now(), item: &codec.WorkItem{}}
	w.traceAccept(j)
	defer guard.Recover(w.log, "work item", func(e *codec.Error) { w.answer(j, nil, e) })
	if err := codec.Decode(m.Data, j.item, asJSON); err != nil {
		w.answer(j, nil, err)
		return
	}
	if err := j.item.Validate(); err != nil {
		w.answer(j, nil, err)
		return
	}
	if j.item.ID == "" {
		j.item.ID = nuid.Next()
	}
	if j.item.ClaimTo != "" {
		// Claims go only to a gateway's claim subject, never where a forged item says.
		var err error
		if j.claim, err = subjects.ClaimFrom(j.item.ClaimTo, w.pool.Name, w.id); err != nil {
			w.answer(j, nil, codec.Errorf(codec.CodeBadRequest, "%v", err).With("field", "claim_to"))
			return
		}
	}
	model, op, err := w.modelFor(j.item.Model, j.item.Op)
	if err != nil {
		w.answer(j, nil, err)
		return
	}
	j.model, j.op = model, op
	w.traceItem(j)
	j.deadline = j.received.Add(w.cfg.Classes[class].Timeout.D())
	if j.item.DeadlineUnixMS > 0 {
		j.deadline = time.UnixMilli(j.item.DeadlineUnixMS)
	} else if j.item.TimeoutMS > 0 {
		j.deadline = j.received.Add(time.Duration(min(j.item.TimeoutMS, maxTimeoutMS)) * time.Millisecond)
	}
	if !time.Now().Before(j.deadline) {
		w.answer(j, nil, codec.Errorf(codec.CodeDeadlineExceeded, "deadline passed before the worker took the request"))
		return
	}
	j.ctx, j.cancel = context.WithDeadline(context.Background(), j.deadline)
	if !w.q.put(j) {
		j.cancel()
		w.answer(j, nil, codec.Errorf(codec.CodeOverloaded, "worker %s: %s queue is full (%d)", w.id, class, w.pool.QueueBound).With("worker", w.id).With("class", class))
		return
	}
	w.claim(j, codec.ClaimTaken, "", nil)
}

// checked is h for the messages the worker may answer: no reply subject, or one that
// subjects.CheckReply accepts under the configured reply prefixes. The gateway checked
// the reply subject of every item it forwards; the worker checks again, since anyone who
// may publish a work item or a control message chooses its reply subject, and a worker
// answers with its own rights. A message with any other reply subject is dropped whole
// (not run, not answered) and counted in the heartbeat's bad_messages. Every subscription
// of the worker goes through it.
func (w *Worker) checked(h nats.MsgHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
		if m.Reply != "" && subjects.CheckReply(m.Reply, w.replies) != nil {
			w.badMessages.Add(1)
			return
		}
		h(m)
	}
}

// claim tells the gateway that dispatched j (its claim_to, if any) that the worker took
// it (taken), or, for an item with reply_direct, that its reply went to the client (done,
// with the reply's error code or its timing).
func (w *Worker) claim(j *job, state string, code codec.Code, t *codec.Timing) {
	if j.claim == "" {
		return
	}
	b, _ := codec.Marshal(&codec.Claim{ID: j.item.ID, Worker: w.id, Pool: w.pool.Name, Attempt: j.item.Attempt, State: state, Code: code, Timing: t})
	if err := w.nc.Publish(j.claim, b); err != nil {
		w.publishFailed("claim", j.item.ID, err)
	}
}

// maxTimeoutMS caps a plain request's timeout_ms (a day), so that the deadline it makes
// never overflows a time.Duration.
const maxTimeoutMS = 24 * 3600 * 1000

// publishFailed counts and logs a message that could not be sent.
func (w *Worker) publishFailed(what, id string, err error) {
	w.publishErrors.Add(1)
	w.log.Warn("publish failed", "what", what, "id", id, "err", err)
}

// slot runs units of work until the queues close.
func (w *Worker) slot(nc *nats.Conn) {
	for {
		unit := w.q.take()
		if unit == nil {
			return
		}
		w.runGuarded(unit)
		w.q.done(unit)
	}
}

// runGuarded runs a unit; a panic in it answers each of its jobs not yet answered
// internal, and the slot goes on.
func (w *Worker) runGuarded(unit []*job) {
	defer guard.Recover(w.log, "unit of work", func(e *codec.Error) {
		for _, j := range unit {
			w.answer(j, nil, e)
		}
	})
	w.runUnit(unit)
}

// runUnit prepares each job (deadline check, image decode), runs the ready ones as one
// runtime call, and answers each exactly once.
func (w *Worker) runUnit(unit []*job) {
	taken := time.Now()
	ready := unit[:0:0]
	for _, j := range unit {
		j.traceStep("ortbus.worker.queue", j.received, taken, nil)
		if err := j.ctx.Err(); err != nil {
			w.answer(j, nil, ctxError(j.ctx, "before running"))
			continue
		}
		fault.Check(j.item.Path)
		if _, err := j.prepare(w.log); err != nil {
			w.answer(j, nil, err)
			continue
		}
		ready = append(ready, j)
	}
	if len(ready) == 0 {
		return
	}
	w.prepareAhead()
	items := make([]models.Item, len(ready))
	for i, j := range ready {
		items[i] = j.prepared
	}
	// One context for the runtime call: cancelled only when every job of the unit is.
	ctx, stop := unitContext(ready)
	defer stop()
	t0 := time.Now()
	replies, errs := ready[0].model.Run(ctx, ready[0].op, items)
	t1 := time.Now()
	inferUS := t1.Sub(t0).Microseconds()
	traceInfer(ready, t0, t1, errs)
	for i, j := range ready {
		err := errs[i]
		if j.ctx.Err() != nil {
			// Cancelled or late while it ran: a result, if any, is discarded.
			err = ctxError(j.ctx, "while running")
		}
		w.answerTimed(j, replies[i], err, taken, inferUS, len(ready))
	}
}

// prepareAhead starts preparing the job a slot will take next (decoding its image,
// reading its tensors) while this unit runs, so that its runtime call can follow this
// one's at once: a worker's Go side works while ONNX Runtime computes (the runtime call
// releases the Go processor). One job ahead, once; a job cancelled meanwhile wastes only
// its preparation.
func (w *Worker) prepareAhead() {
	j := w.q.next()
	if j == nil || j.ctx.Err() != nil || j.ahead.Swap(true) {
		return
	}
	go j.prepare(w.log)
}

// unitContext is done when every job's context is done.
func unitContext(unit []*job) (context.Context, func()) {
	if len(unit) == 1 {
		return unit[0].ctx, func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for _, j := range unit {
			select {
			case <-j.ctx.Done():
			case <-ctx.Done():
				return
			}
		}
		cancel()
	}()
	return ctx, cancel
}

func ctxError(ctx context.Context, when string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return codec.Errorf(codec.CodeDeadlineExceeded, "deadline passed %s", when)
	}
	return codec.Errorf(codec.CodeCancelled, "request cancelled %s", when)
}

func (w *Worker) answerTimed(j *job, rep codec.Replier, err error, start time.Time, inferUS int64, batch int) {
	if rep != nil {
		s := rep.Meta()
		s.Timing = timing(j, start, inferUS)
		s.Timing.Batch = batch
	}
	w.answer(j, rep, err)
}

// timing: queue_us is the wait until a slot took the item (in the gateway and in the
// worker), infer_us the runtime call, total_us everything since the gateway accepted it.
func timing(j *job, start time.Time, inferUS int64) codec.Timing {
	since := j.received
	if j.item.EnqueuedUnixUS > 0 {
		since = time.UnixMicro(j.item.EnqueuedUnixUS)
	}
	return codec.Timing{QueueUS: max(0, start.Sub(since).Microseconds()), InferUS: inferUS, TotalUS: max(0, time.Since(since).Microseconds())}
}

// answer sends the one terminal reply of a job — the result, or an error with
// micro-style headers and a {code, message, details} body — and ignores later calls. A
// result too large for the bus is answered reply_too_large.
func (w *Worker) answer(j *job, rep codec.Replier, err error) {
	if !j.answered.CompareAndSwap(false, true) {
		return
	}
	if j.cancel != nil {
		defer j.cancel()
	}
	// The job's hold on its model's copy ends with its answer (modelSet, rule 2).
	defer w.models.release(j.model)
	if j.msg.Reply == "" {
		j.traceAnswer(string(codec.CodeOf(err)))
		return
	}
	if err == nil && rep == nil {
		err = codec.Errorf(codec.CodeInternal, "no result")
	}
	var out *nats.Msg
	var code codec.Code
	var t *codec.Timing
	if err != nil {
		e := codec.AsError(err)
		code = e.Code
		if e.Code == codec.CodeInternal {
			w.log.Error("request failed", "id", j.item.ID, "err", err)
		}
		out = reply.Error(j.msg.Reply, e, j.asJSON)
		w.failed.Add(1)
	} else {
		s := rep.Meta()
		s.ID, s.Model, s.Pool, s.Worker, s.Runtime, s.EP = j.item.ID, j.model.Name(), w.pool.Name, w.id, w.rt.Version, w.EP()
		t0 := time.Now()
		b, encErr := codec.Encode(rep, j.asJSON)
		j.traceStep("ortbus.worker.encode", t0, time.Now(), encErr)
		if encErr != nil {
			out = reply.Error(j.msg.Reply, codec.Errorf(codec.CodeInternal, "encode reply: %v", encErr), j.asJSON)
			code = codec.CodeInternal
			w.failed.Add(1)
		} else {
			out = reply.Result(j.msg.Reply, b, j.asJSON)
			t = &s.Timing
			w.served.Add(1)
		}
	}
	if out = reply.Fit(out, w.nc.MaxPayload()); code == "" && out.Header.Get(reply.HeaderErrorCode) != "" {
		code, t = codec.CodeReplyTooLarge, nil
	}
	if err := w.nc.PublishMsg(out); err != nil {
		w.publishFailed("reply", j.item.ID, err)
	}
	j.traceAnswer(string(code))
	if j.item.ReplyDirect {
		// After the reply, never before: a worker that dies between the two leaves the
		// gateway to retry a request whose client already has its answer (a duplicate
		// the client drops), never a request answered to the gateway and not the client.
		w.claim(j, codec.ClaimDone, code, t)
	}
}

// control subscribes to cancels and to this worker's control verbs: stats and drain
// (answered with a heartbeat snapshot), load and unload (a model changed in place:
// inplace.go).
func (w *Worker) control(nc *nats.Conn) ([]*nats.Subscription, error) {
	cs, err := nc.Subscribe(subjects.Cancel, guard.Msg(w.log, "cancel", nc, w.replies, w.checked(func(m *nats.Msg) {
		var c codec.Cancel
		if codec.Decode(m.Data, &c, m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON) != nil || c.ID == "" {
			return
		}
		if j, found := w.q.cancel(c.ID); found {
			if j != nil {
				w.answer(j, nil, codec.Errorf(codec.CodeCancelled, "cancelled while queued"))
			}
			if m.Reply != "" {
				b, _ := codec.Marshal(&codec.CancelReply{ID: c.ID, Found: true})
				if err := m.Respond(b); err != nil {
					w.publishFailed("cancel reply", c.ID, err)
				}
			}
		}
	})))
	if err != nil {
		return nil, err
	}
	subs := []*nats.Subscription{cs}
	for _, verb := range []string{subjects.VerbStats, subjects.VerbDrain, subjects.VerbLoad, subjects.VerbUnload} {
		subj, err := subjects.Worker(w.id, verb)
		if err != nil {
			return nil, err
		}
		verb := verb
		s, err := nc.Subscribe(subj, guard.Msg(w.log, "control", nc, w.replies, w.checked(func(m *nats.Msg) {
			if verb == subjects.VerbLoad || verb == subjects.VerbUnload {
				w.controlModels(nc, verb, m)
				return
			}
			if verb == subjects.VerbDrain {
				w.draining.Store(true)
			}
			asJSON := m.Header.Get(codec.HeaderContentType) == codec.ContentTypeJSON
			b, _ := codec.Encode(w.snapshot(), asJSON)
			if err := m.Respond(b); err != nil {
				w.publishFailed(verb, "", err)
			}
		})))
		if err != nil {
			return nil, err
		}
		subs = append(subs, s)
	}
	return subs, nil
}

// heartbeats makes the worker's heartbeat publisher.
func (w *Worker) heartbeats(nc *nats.Conn) (*health.Publisher, error) {
	p, err := health.NewPublisher(nc, w.pool.Name, w.id, w.cfg.Health.HeartbeatInterval.D(), w.snapshot)
	if p != nil {
		p.OnError = func(err error) { w.publishFailed("heartbeat", "", err) }
	}
	return p, err
}

// snapshot is the worker's state as a heartbeat.
func (w *Worker) snapshot() *codec.Heartbeat {
	queued, running, held := w.q.counts()
	state := codec.StateReady
	if w.draining.Load() {
		state = codec.StateDraining
	}
	devBytes, devSource := w.dev.last()
	return &codec.Heartbeat{
		Worker: w.id, Pool: w.pool.Name, Host: w.host, PID: pid, State: state,
		Runtime: w.rt.Version, Library: w.rt.Path, EP: w.EP(), Device: w.pool.Device,
		Classes: w.pool.Classes, Models: w.models.statuses(), Slots: w.pool.Slots, Direct: true,
		Queued: queued, Running: running, Held: held,
		Served: w.served.Load(), Failed: w.failed.Load(), SessionsCreated: ort.SessionsCreated(),
		RSSBytes: rssBytes(), DeviceBytes: devBytes, DeviceSource: devSource, UptimeMS: time.Since(w.start).Milliseconds(),
		Panics: guard.Panics(), PublishErrors: w.publishErrors.Load(), BadMessages: w.badMessages.Load(),
	}
}
