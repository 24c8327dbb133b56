package worker

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/subjects"
)

// replier sends the worker's answers and claims, and counts them. Its rules:
//
//  1. A job has exactly one terminal answer (answer): the result, or an error with
//     micro-style headers and a {code, message, details} body; later calls are ignored.
//  2. A job's hold on its model's copy ends with its answer (modelSet, rule 2).
//  3. A result too large for the bus is answered reply_too_large (reply.Fit).
//  4. Claims go to the gateway that dispatched the job (its claim subject, checked at
//     acceptance): taken when it is queued, and, for an item with reply_direct, done once
//     its reply went to the client — after the reply, never before.
//  5. A message that cannot be sent is counted (publish errors) and logged.
//  6. The reply of an item with reply_direct goes to the client only once its gateway
//     said the attempt is the worker's (verdicts, verdict.go): its taken claim asks for
//     that verdict, on the worker's verdict subject.
type replier struct {
	// stamp is the worker's part of each result's Served (pool, worker, runtime), and
	// claimAs of each claim (worker, pool): who answers, fixed when the worker is wired.
	stamp   codec.Served
	claimAs codec.Claim
	log     *slog.Logger
	models  *modelSet
	// gate holds direct replies until their verdict (rule 6); verdictTo is the reply
	// subject of the claims that ask for one.
	gate      *verdicts
	verdictTo string
	// nc is the connection the answers go out on: set (connect) before any subscription
	// hands the worker a message.
	nc *nats.Conn

	served, failed, publishErrors atomic.Uint64
}

func newReplier(stamp codec.Served, claimAs codec.Claim, log *slog.Logger, ms *modelSet) *replier {
	to, _ := subjects.Worker(claimAs.Worker, subjects.VerbVerdict) // the id was checked (Options)
	return &replier{stamp: stamp, claimAs: claimAs, log: log, models: ms, gate: newVerdicts(), verdictTo: to}
}

// connect sets the connection the answers go out on.
func (r *replier) connect(nc *nats.Conn) { r.nc = nc }

// publishFailed counts and logs a message that could not be sent (rule 5).
func (r *replier) publishFailed(what, id string, err error) {
	r.publishErrors.Add(1)
	r.log.Warn("publish failed", "what", what, "id", id, "err", err)
}

// claim tells the gateway that dispatched j (its claim_to, if any) that the worker took
// it (taken), or, for an item with reply_direct, that its reply went to the client (done,
// with the reply's error code or its timing) (rule 4).
func (r *replier) claim(j *job, state string, code codec.Code, t *codec.Timing) {
	if j.claim == "" {
		return
	}
	c := r.claimAs
	c.ID, c.Attempt, c.State, c.Code, c.Timing = j.item.ID, j.item.Attempt, state, code, t
	m := &nats.Msg{Subject: j.claim}
	m.Data, _ = codec.Marshal(&c)
	if state == codec.ClaimTaken && j.verdict != nil {
		m.Reply = r.verdictTo // rule 6
	}
	if err := r.nc.PublishMsg(m); err != nil {
		r.publishFailed("claim", j.item.ID, err)
	}
}

// answer sends the one terminal reply of a job (rules 1 to 4).
func (r *replier) answer(j *job, rep codec.Replier, err error) {
	if !j.answered.CompareAndSwap(false, true) {
		return
	}
	if j.cancel != nil {
		defer j.cancel()
	}
	defer r.models.release(j.model) // rule 2
	if j.msg.Reply == "" {
		j.trace.answer(string(codec.CodeOf(err)))
		return
	}
	if err == nil && rep == nil {
		err = codec.Errorf(codec.CodeInternal, "no result")
	}
	out, code, t := r.message(j, rep, err)
	if out = reply.Fit(out, r.nc.MaxPayload()); code == "" && out.Header.Get(reply.HeaderErrorCode) != "" {
		code, t = codec.CodeReplyTooLarge, nil
	}
	send := func() {
		if err := r.nc.PublishMsg(out); err != nil {
			r.publishFailed("reply", j.item.ID, err)
		}
		j.trace.answer(string(code))
		if j.item.ReplyDirect {
			// After the reply, never before: a worker that dies between the two leaves the
			// gateway to retry a request whose client already has its answer (a duplicate
			// the client drops), never a request answered to the gateway and not the client.
			r.claim(j, codec.ClaimDone, code, t)
		}
	}
	if j.verdict != nil {
		r.gate.deliver(j.verdict, len(out.Data), send) // rule 6
		return
	}
	send()
}

// message is j's reply: the result rep, encoded, or the error err; with the error's code
// ("" for a result) and the result's timing.
func (r *replier) message(j *job, rep codec.Replier, err error) (*nats.Msg, codec.Code, *codec.Timing) {
	if err != nil {
		e := codec.AsError(err)
		if e.Code == codec.CodeInternal {
			r.log.Error("request failed", "id", j.item.ID, "err", err)
		}
		r.failed.Add(1)
		return reply.Error(j.msg.Reply, e, j.asJSON), e.Code, nil
	}
	s := rep.Meta()
	slotTiming := s.Timing // the slot's; the rest is the worker's (stamp) and the job's
	*s = r.stamp
	s.ID, s.Model, s.EP, s.Timing = j.item.ID, j.model.Name(), r.models.execProvider(), slotTiming
	t0 := time.Now()
	b, encErr := codec.Encode(rep, j.asJSON)
	j.trace.step("ortbus.worker.encode", t0, time.Now(), encErr)
	if encErr != nil {
		r.failed.Add(1)
		return reply.Error(j.msg.Reply, codec.Errorf(codec.CodeInternal, "encode reply: %v", encErr), j.asJSON), codec.CodeInternal, nil
	}
	r.served.Add(1)
	return reply.Result(j.msg.Reply, b, j.asJSON), "", &s.Timing
}
