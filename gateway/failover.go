package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/subjects"
)

// Failover between gateways. Several gateways share the client API's queue group; a
// client's request is held by whichever took it, and only that gateway may answer it
// (under deploy/cluster's permissions a gateway may answer only the requests it
// received). So a gateway's death is repaired by the client, with the gateways' help:
//
//  1. Every gateway beats on ortbus.gw.<id>.hb every heartbeat interval, and follows its
//     peers' beats: a peer silent for miss_count of its intervals is dead.
//  2. A client that follows the beats too (the Go and TS clients with failover on) sends
//     again, with the same id and the header Ortbus-Resend, a request it still waits for
//     when the gateway holding it dies (any gateway, while no notice has named the
//     holder); whichever gateway takes the resend answers it.
//  3. A gateway taking a resend answers at once with the notice header Ortbus-Held
//     (empty body; the client goes on waiting) when the request is still held by a live
//     gateway: itself (same id, same owner), or, per the answers bucket, a peer that
//     beats. Otherwise it runs the request, or, when the answers bucket holds the answer
//     a gateway gave it, sends that answer again. The bucket is read off the API handler
//     (resendReaders, resendBacklog: overloaded past it). The client takes the first
//     answer that is not a notice; every other reply to the same call is dropped by it.
//  4. With gateway.failover = true and JetStream, a gateway records in the KV bucket
//     ortbus_answers (entries kept failoverTTL) each request it accepts over NATS, under
//     a key of its owner and id, and then its answer: that is what rule 3 reads. Records
//     are written without waiting (a request is never slowed by them); a record that is
//     missing only means a request runs again, never that it is lost.
//
// What is not covered: a request whose gateway dies before the client's resend is not
// recorded anywhere runs again when it is resent (inference is idempotent).
type failover struct {
	// What it needs of the rest of the gateway, wired at construction (newFailover).
	id      string
	nc      *nats.Conn
	conf    func() *config.Config
	log     *slog.Logger
	metrics *metrics
	// holds reports whether this gateway holds the unanswered request id of owner (the
	// dispatcher's lifecycle, asked on its loop).
	holds func(id, owner string) bool
	// accepting reports whether the API still takes requests; handle runs a request
	// through the API's handler (a resend run as new).
	accepting func() bool
	handle    func(op string, r micro.Request)

	beat string
	mu   sync.Mutex
	// peers are the other gateways heard, by id (bounded by maxPeers).
	peers map[string]*peer
	kv    jetstream.KeyValue // nil without gateway.failover or JetStream
	js    jetstream.JetStream
	stop  chan struct{}
	// reads are the resends waiting for an answers-bucket read (rule 3), done by
	// resendReaders goroutines off the API handler; a resend finding it full is answered
	// overloaded.
	reads chan func()
}

type peer struct {
	seen     time.Time
	interval time.Duration
}

// Failover's headers and bounds.
const (
	// AnswersBucket keeps what gateways accepted and answered, for resends.
	AnswersBucket = "ortbus_answers"
	// failoverTTL is how long an answers record is kept: a client resends within
	// miss_count heartbeat intervals of a death.
	failoverTTL = time.Minute
	// maxPeers bounds the peer gateways followed; beats of more are dropped (counted).
	maxPeers = 64
	// maxStoredAnswer bounds an answer kept for a resend; a larger one is not kept (its
	// request would run again).
	maxStoredAnswer = 256 << 10
	// resendReaders read the answers bucket for resends, so that a slow read never holds
	// the API handler (which takes every request of its op in turn); resendBacklog
	// bounds the resends waiting for them, past which a resend is answered overloaded.
	resendReaders = 8
	// 64: a resend waits at most 64/8 reads (16 s of resendReadTimeout) for its turn,
	// within a client's deadline; past that, overloaded says to send again later.
	resendBacklog = 64
	// resendReadTimeout bounds one read of the answers bucket.
	resendReadTimeout = 2 * time.Second
)

// answerRecord is the value of an answers record: who holds the request, and its answer
// once there is one.
type answerRecord struct {
	Gateway  string       `msgpack:"g"`
	Answered bool         `msgpack:"a,omitempty"`
	Body     []byte       `msgpack:"b,omitempty"`
	Err      *codec.Error `msgpack:"e,omitempty"`
}

// newFailover is the failover of gateway id (its resend readers running until close);
// start starts its beats. holds asks the dispatch loop; accepting and handle are the
// API's (nil: always accepting, a resend run by nothing).
func newFailover(id string, nc *nats.Conn, conf func() *config.Config, log *slog.Logger, m *metrics, holds func(id, owner string) bool,
	accepting func() bool, handle func(op string, r micro.Request)) *failover {
	if accepting == nil {
		accepting = func() bool { return true }
	}
	if handle == nil {
		handle = func(string, micro.Request) {}
	}
	f := &failover{id: id, nc: nc, conf: conf, log: log, metrics: m, holds: holds, accepting: accepting, handle: handle,
		peers: map[string]*peer{}, stop: make(chan struct{}), reads: make(chan func(), resendBacklog)}
	for range resendReaders {
		go f.reader()
	}
	return f
}

// start starts the beats and the peer tracking (always: clients follow the beats) and,
// with gateway.failover, opens the answers bucket in the background.
func (f *failover) start(ctx context.Context) error {
	var err error
	if f.beat, err = subjects.GatewayBeat(f.id); err != nil {
		return err
	}
	if _, err := f.nc.Subscribe(subjects.GWAll, guard.Msg(f.log, "failover", f.nc, nil, f.hear)); err != nil {
		return err
	}
	go f.run()
	if cfg := f.conf(); cfg.Gateway.Failover && !(cfg.NATS.Embedded && cfg.NATS.StoreDir == "") {
		go f.openAnswers(ctx)
	}
	return nil
}

// reader runs the answers-bucket reads of resends until close, then those still waiting
// (each is bounded by resendReadTimeout): every resend taken is answered.
func (f *failover) reader() {
	for {
		select {
		case read := <-f.reads:
			read()
		case <-f.stop:
			for {
				select {
				case read := <-f.reads:
					read()
				default:
					return
				}
			}
		}
	}
}

// openAnswers opens the answers bucket, trying again while JetStream is not ready.
func (f *failover) openAnswers(ctx context.Context) {
	// Records are published without waiting; a backlog past this many unacknowledged
	// stalls the publisher (up to 200 ms), so the bound is generous.
	js, err := jetstream.New(f.nc, jetstream.WithPublishAsyncMaxPending(1<<16))
	if err != nil { // only a bad option: nothing to try again
		f.log.Error("open the answers bucket", "err", err)
		return
	}
	var kv jetstream.KeyValue
	if !defaultJSOpener.open(ctx, f.log, "answers bucket", func(actx context.Context) (err error) {
		kv, err = js.CreateOrUpdateKeyValue(actx, jetstream.KeyValueConfig{
			Bucket:      AnswersBucket,
			Description: "ortbus: requests accepted and answered, for clients' resends",
			TTL:         failoverTTL,
			History:     1,
			Replicas:    f.conf().Jobs.Replicas,
		})
		return err
	}, nil) {
		return
	}
	f.mu.Lock()
	f.js, f.kv = js, kv
	f.mu.Unlock()
	f.log.Info("answers bucket open")
}

// answerKey is the bucket key of a request: a hash of its owner and id (any bytes of
// either are fine; the key is hex).
func answerKey(owner, id string) string {
	h := sha256.Sum256([]byte(owner + "\x00" + id))
	return hex.EncodeToString(h[:16])
}

// record writes p's record (rule 4), without waiting: accepted, or answered with body or
// e. Only requests taken over NATS (a reply subject) are recorded.
func (f *failover) record(p *pending, answered bool, body []byte, e *codec.Error) {
	if f == nil {
		return
	}
	f.mu.Lock()
	js := f.js
	f.mu.Unlock()
	if js == nil || p.replyTo == "" || p.owner == ownerJob {
		return
	}
	rec := answerRecord{Gateway: f.id, Answered: answered, Err: e}
	if answered && e == nil {
		if len(body) > maxStoredAnswer {
			return // too large to keep: a resend runs it again
		}
		rec.Body = body
	}
	b, err := codec.Marshal(&rec)
	if err != nil {
		return
	}
	if _, err := js.PublishAsync("$KV."+AnswersBucket+"."+answerKey(p.owner, p.id), b); err != nil {
		f.metrics.publishFailed("answers record", err)
	}
}

// resent handles a resend (rule 3): true when it has answered it or will (a notice, the
// kept answer, or the request run as new once the answers bucket has been read), false
// when the request is to run as a new one now.
//
// The answers bucket is read off the API handler, by the resend readers: the handler
// takes every request of its op in turn, and a slow read (JetStream busy, a leader
// election) must not hold them. A resend that finds resendBacklog resends waiting is
// answered overloaded. Each resend is answered exactly once: by a notice, by respond, or
// by the gateway's handler when it runs as new.
func (f *failover) resent(r micro.Request, id, owner string, respond Reply) bool {
	if f == nil {
		return false
	}
	if f.holds(id, owner) {
		f.notice(r, f.id)
		return true
	}
	f.mu.Lock()
	kv := f.kv
	f.mu.Unlock()
	if kv == nil {
		return false
	}
	op, _ := strings.CutPrefix(r.Subject(), subjects.APIPrefix+".")
	if !subjects.IsWork(op) {
		return false // not an inference endpoint's subject: run here as it is
	}
	read := func() {
		defer guard.Recover(f.log, "resend "+op, func(e *codec.Error) { respond(nil, e) })
		switch {
		case f.answerKept(r, id, owner, kv, respond):
		case !f.accepting():
			// The gateway stopped taking requests while the bucket was read: its queues
			// may be answered already, so this one is answered as they were.
			respond(nil, codec.Errorf(codec.CodeNoWorker, "gateway shut down before the request was dispatched"))
		default:
			// Runs as a new request, through the handler as if it had not been resent.
			f.handle(op, fresh{r})
		}
	}
	select {
	case f.reads <- read:
	default:
		respond(nil, codec.Errorf(codec.CodeOverloaded, "%d resends are waiting for the answers bucket; send again later", resendBacklog))
	}
	return true
}

// answerKept answers a resend from the answers bucket when it can (rule 3): the answer a
// gateway gave, or a notice naming the live gateway that holds it. False: the request is
// to run as a new one (no record, a record of a dead gateway or of this one before a
// restart, or a bucket that cannot be read now).
func (f *failover) answerKept(r micro.Request, id, owner string, kv jetstream.KeyValue, respond Reply) bool {
	if f.holds(id, owner) {
		// Taken meanwhile (another resend of it that ran as new): held here.
		f.notice(r, f.id)
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), resendReadTimeout)
	defer cancel()
	entry, err := kv.Get(ctx, answerKey(owner, id))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			f.log.Warn("read the answers bucket", "err", err)
		}
		return false
	}
	var rec answerRecord
	if codec.Unmarshal(entry.Value(), &rec) != nil {
		return false
	}
	switch {
	case rec.Answered:
		respond(rec.Body, rec.Err)
		return true
	case rec.Gateway != f.id && f.alive(rec.Gateway):
		f.notice(r, rec.Gateway)
		return true
	}
	return false // held by a dead gateway (or by this one before a restart): run it
}

// fresh is a resend as a new request: its headers without Ortbus-Resend, so the handler
// runs it.
type fresh struct{ micro.Request }

func (r fresh) Headers() micro.Headers {
	h := micro.Headers{}
	for k, v := range r.Request.Headers() {
		if !strings.EqualFold(k, codec.HeaderResend) {
			h[k] = v
		}
	}
	return h
}

// notice replies that the request is held by gateway.
func (f *failover) notice(r micro.Request, gateway string) {
	if err := r.Respond(nil, micro.WithHeaders(micro.Headers{codec.HeaderHeld: {gateway}})); err != nil {
		f.metrics.publishFailed("reply", err)
	}
}

// alive reports whether peer gateway id beats (rule 1).
func (f *failover) alive(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	pr := f.peers[id]
	return pr != nil && !health.Silent(time.Now(), pr.seen, pr.interval, f.conf().Health.MissCount)
}

// hear follows peers' beats.
func (f *failover) hear(m *nats.Msg) {
	ps, err := subjects.Parse(m.Subject)
	if err != nil || ps.Kind != subjects.KindGateway || ps.Worker == f.id || ps.Verb != "hb" {
		return
	}
	var b codec.GatewayBeat
	if codec.Unmarshal(m.Data, &b) != nil || b.Gateway != ps.Worker || b.IntervalMS <= 0 || b.IntervalMS > time.Hour.Milliseconds() {
		f.metrics.bad("gateway beat")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	pr := f.peers[ps.Worker]
	if pr == nil {
		f.forgetSilent()
		if len(f.peers) >= maxPeers {
			f.metrics.bad("gateway beat")
			return
		}
		pr = &peer{}
		f.peers[ps.Worker] = pr
		f.log.Info("peer gateway heard", "gateway", ps.Worker)
	}
	pr.seen, pr.interval = time.Now(), time.Duration(b.IntervalMS)*time.Millisecond
}

// forgetSilent drops peers silent for long (their records have expired): f.mu held.
func (f *failover) forgetSilent() {
	for id, pr := range f.peers {
		if time.Since(pr.seen) > failoverTTL+pr.interval*time.Duration(f.conf().Health.MissCount) {
			delete(f.peers, id)
		}
	}
}

// run beats until the gateway stops.
func (f *failover) run() {
	iv := f.conf().Health.HeartbeatInterval.D()
	beat := time.NewTicker(iv)
	defer beat.Stop()
	var seq uint64
	for {
		seq++
		if b, err := codec.Marshal(&codec.GatewayBeat{Gateway: f.id, Seq: seq, IntervalMS: iv.Milliseconds()}); err == nil {
			if err := f.nc.Publish(f.beat, b); err != nil {
				f.metrics.publishFailed("gateway beat", err)
			}
		}
		select {
		case <-f.stop:
			return
		case <-beat.C:
		}
	}
}

func (f *failover) close() {
	if f != nil {
		close(f.stop)
	}
}
