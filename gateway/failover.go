package gateway

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/internal/reply"
	"github.com/ortbus/ortbus/subjects"
)

// Failover between gateways (config gateway.failover = true). Several gateways share the
// client API's queue group; a client's request is held by whichever took it. So that a
// gateway's death never leaves its clients hanging, each gateway
//
//   - beats on ortbus.gw.<id>.hb every heartbeat interval, and
//   - journals on ortbus.gw.<id>.log every request it accepts over NATS (the client's
//     reply subject and raw body), when it dispatches it to a worker, and when it answers.
//
// Every gateway follows its peers' beats and journals. When a peer is silent for
// miss_count intervals, the live gateway with the lowest id takes over the peer's
// unanswered requests, answering each client directly on its reply subject:
//
//   - a request still queued (never dispatched) never ran: it is submitted again here and
//     runs once;
//   - a request already dispatched may be running or done at a worker whose answer went to
//     the dead gateway: it is not run again (no silent double execution) and is answered
//     worker_lost with details {gateway}, so the client can decide to retry.
type failover struct {
	g     *Gateway
	log   string // our journal subject
	beat  string
	mu    sync.Mutex
	peers map[string]*peer
	stop  chan struct{}
}

type peer struct {
	seen     time.Time
	interval time.Duration
	dead     bool
	pending  map[string]*codec.JournalEntry
	bytes    int64 // raw request bytes held in pending
}

// Bounds on what peers' journals may make this gateway hold: a forged or runaway journal
// is dropped past them (and counted as bad journal messages), never grows memory.
const (
	maxPeers        = 16
	maxPeerPending  = 100000
	maxPeerBytes    = 256 << 20
	maxJournalReply = 256
)

// validJournal checks a journal entry from the wire: a valid id, a known state, and for
// an accepted request an API op and a reply subject that is an inbox — never a subject of
// ortbus's own (a forged entry must not make this gateway publish work or heartbeats).
func validJournal(e *codec.JournalEntry) bool {
	if codec.CheckID("id", e.ID) != nil {
		return false
	}
	switch e.State {
	case codec.JournalDispatched, codec.JournalDone:
		return true
	case codec.JournalAccepted:
	default:
		return false
	}
	if _, err := subjects.API(e.Op); err != nil || !slices.Contains(subjects.Ops, e.Op) {
		return false
	}
	r := e.Reply
	if r == "" || len(r) > maxJournalReply || strings.ContainsAny(r, "*> \t\r\n") || strings.HasPrefix(r, "$") ||
		strings.HasPrefix(r, "ortbus.") || strings.HasPrefix(r, subjects.InferPrefix+".") {
		return false
	}
	for _, tok := range strings.Split(r, ".") {
		if subjects.ValidateToken("reply", tok) != nil {
			return false
		}
	}
	return true
}

func (g *Gateway) startFailover() error {
	if !g.cfg.Gateway.Failover {
		return nil
	}
	f := &failover{g: g, peers: map[string]*peer{}, stop: make(chan struct{})}
	var err error
	if f.log, err = subjects.GatewayLog(g.id); err != nil {
		return err
	}
	if f.beat, err = subjects.GatewayBeat(g.id); err != nil {
		return err
	}
	if _, err := g.nc.Subscribe(subjects.GWAll, guard.Msg(g.log, "failover", g.nc, f.hear)); err != nil {
		return err
	}
	g.failover = f
	go f.run()
	return nil
}

// record journals one state change of a request taken over NATS (replyTo set).
func (f *failover) record(p *pending, state string, raw []byte) {
	if f == nil || p.replyTo == "" {
		return
	}
	e := codec.JournalEntry{ID: p.id, State: state}
	if state == codec.JournalAccepted {
		e.Op, e.Reply, e.JSON, e.Request = p.op, p.replyTo, p.asJSON, raw
	}
	if b, err := codec.Marshal(&e); err == nil {
		if err := f.g.nc.Publish(f.log, b); err != nil {
			f.g.publishFailed("journal", err)
		}
	}
}

// hear follows peers' beats and journals.
func (f *failover) hear(m *nats.Msg) {
	ps, err := subjects.Parse(m.Subject)
	if err != nil || ps.Kind != subjects.KindGateway || ps.Worker == f.g.id {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	pr := f.peers[ps.Worker]
	if pr == nil {
		if len(f.peers) >= maxPeers {
			f.g.metrics.bad("journal")
			return
		}
		pr = &peer{pending: map[string]*codec.JournalEntry{}, interval: f.g.cfg.Health.HeartbeatInterval.D()}
		f.peers[ps.Worker] = pr
		f.g.log.Info("peer gateway heard", "gateway", ps.Worker)
	}
	// Any message of a peer is a sign of life: a peer that dies before its next beat,
	// known so far only from its journal, must still be judged.
	pr.seen, pr.dead = time.Now(), false
	switch ps.Verb {
	case "hb":
		var b codec.GatewayBeat
		if codec.Unmarshal(m.Data, &b) == nil && b.IntervalMS > 0 && b.IntervalMS <= time.Hour.Milliseconds() {
			pr.interval = time.Duration(b.IntervalMS) * time.Millisecond
		}
	case "log":
		var e codec.JournalEntry
		if codec.Unmarshal(m.Data, &e) != nil || !validJournal(&e) {
			f.g.metrics.bad("journal")
			return
		}
		switch e.State {
		case codec.JournalAccepted:
			if x := pr.pending[e.ID]; x != nil {
				pr.bytes -= int64(len(x.Request))
				delete(pr.pending, e.ID)
			}
			if len(pr.pending) >= maxPeerPending || pr.bytes+int64(len(e.Request)) > maxPeerBytes {
				f.g.metrics.bad("journal")
				return
			}
			pr.pending[e.ID] = &e
			pr.bytes += int64(len(e.Request))
		case codec.JournalDispatched:
			if x := pr.pending[e.ID]; x != nil {
				x.State = e.State
			}
		case codec.JournalDone:
			if x := pr.pending[e.ID]; x != nil {
				pr.bytes -= int64(len(x.Request))
				delete(pr.pending, e.ID)
			}
		}
	}
}

// run beats and judges peers until the gateway stops.
func (f *failover) run() {
	iv := f.g.cfg.Health.HeartbeatInterval.D()
	beat := time.NewTicker(iv)
	judge := time.NewTicker(max(5*time.Millisecond, iv/10))
	defer beat.Stop()
	defer judge.Stop()
	var seq uint64
	send := func() {
		seq++
		if b, err := codec.Marshal(&codec.GatewayBeat{Gateway: f.g.id, Seq: seq, IntervalMS: iv.Milliseconds()}); err == nil {
			if err := f.g.nc.Publish(f.beat, b); err != nil {
				f.g.publishFailed("gateway beat", err)
			}
		}
	}
	send()
	for {
		select {
		case <-f.stop:
			return
		case <-beat.C:
			send()
		case now := <-judge.C:
			if !f.g.nc.IsConnected() {
				continue
			}
			f.judge(now)
		}
	}
}

// judge takes over the requests of peers that went silent, if this gateway is the live
// one with the lowest id.
func (f *failover) judge(now time.Time) {
	f.mu.Lock()
	var died []string
	live := []string{f.g.id}
	for id, pr := range f.peers {
		if pr.dead {
			continue
		}
		if health.Silent(now, pr.seen, pr.interval, f.g.cfg.Health.MissCount) {
			pr.dead = true
			died = append(died, id)
		} else {
			live = append(live, id)
		}
	}
	sort.Strings(live)
	mine := live[0] == f.g.id
	var work []*codec.JournalEntry
	dead := map[*codec.JournalEntry]string{}
	for _, id := range died {
		for _, e := range f.peers[id].pending {
			work = append(work, e)
			dead[e] = id
		}
		f.peers[id].pending, f.peers[id].bytes = map[string]*codec.JournalEntry{}, 0
	}
	f.mu.Unlock()
	for _, id := range died {
		f.g.log.Warn("peer gateway silent: judged dead", "gateway", id, "unanswered", len(work), "taking_over", mine)
	}
	if !mine {
		return
	}
	for _, e := range work {
		f.takeOver(e, dead[e])
	}
}

func (f *failover) takeOver(e *codec.JournalEntry, from string) {
	g := f.g
	reply := func(body []byte, err *codec.Error) { publishReply(g.nc, e.Reply, e.JSON, body, err) }
	if e.State == codec.JournalAccepted {
		g.log.Warn("taking over a queued request of a dead gateway", "gateway", from, "id", e.ID)
		g.submitFrom(e.Op, e.Request, e.JSON, e.Reply, ownerOf(e.Reply), reply)
		return
	}
	g.log.Warn("answering an in-flight request of a dead gateway", "gateway", from, "id", e.ID)
	reply(nil, codec.Errorf(codec.CodeWorkerLost, "gateway %s died while the request was in flight; it may have run, so it is not run again", from).
		With("gateway", from).With("id", e.ID))
}

func (f *failover) close() {
	if f != nil {
		close(f.stop)
	}
}

// publishReply sends a terminal reply to a client's reply subject the way the micro
// service would: the body, or an error with its headers.
func publishReply(nc *nats.Conn, subject string, asJSON bool, body []byte, e *codec.Error) error {
	if e != nil {
		return reply.Send(nc, reply.Error(subject, e, asJSON))
	}
	return reply.Send(nc, reply.Result(subject, body, asJSON))
}
