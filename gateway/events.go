package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// The page's data (page.go), over the HTTP API: GET /v1/snapshot answers one snapshot,
// GET /v1/events streams one every eventEvery as server-sent events. The rules:
//
//  1. A snapshot is what the API answers its caller (httpcaller.go) at that moment, put
//     together, never computed a second time: the status op's StatusReply and the
//     job.list op's JobListReply, both served as for any request of that caller (an
//     account sees its own jobs and leases only), and the classes' p95 history
//     (classstats.go). A job list that fails (no job store) is its error.
//  2. One snapshot per caller is made at most every snapshotReuse: the streams and
//     snapshot requests of one caller within it share it.
//  3. A stream is `text/event-stream`: `retry: 1000` first (a browser's EventSource
//     reconnects a second after a lost stream: a gateway's restart), then an event
//     `snapshot` whose data is the snapshot's JSON on one line, every eventEvery; an
//     event `error` (an Error) when a snapshot fails. Each event must be written within
//     eventWriteBound, else the stream ends: a stalled reader holds nothing for long.
//  4. At most maxStreams streams are open at once (a quarter of the HTTP connections:
//     httpMaxConns), else 429 overloaded; a snapshot request takes one of the API's
//     concurrency slots as any request does. Streams end when their client goes, and
//     when the server shuts down (close).
type eventStreams struct {
	a       *httpAPI
	history func() map[string][]float64 // the classes' p95 history; nil: none
	slots   chan struct{}               // one per open stream
	done    chan struct{}               // closed by close
	once    sync.Once

	mu    sync.Mutex
	memos map[string]*snapshotMemo // by caller
}

// snapshotMemo is one caller's latest snapshot (rule 2); mu is held while it is made.
type snapshotMemo struct {
	mu   sync.Mutex
	at   time.Time
	body []byte
	err  *codec.Error
}

// The streams' timing and bounds (rules 2 to 4).
const (
	eventEvery      = time.Second
	eventRetryMS    = 1000
	eventWriteBound = 10 * time.Second
	snapshotReuse   = 900 * time.Millisecond
	// snapshotBound bounds the making of one snapshot (the job list reads JetStream).
	snapshotBound = 5 * time.Second
)

// pageSnapshot is one snapshot (rule 1).
type pageSnapshot struct {
	NowUnixMS int64 `json:"now_unix_ms"`
	// Account is the caller's account: "" for the operator, else "account:NAME".
	Account string          `json:"account"`
	Status  json.RawMessage `json:"status"`
	Jobs    json.RawMessage `json:"jobs,omitempty"`
	// JobsError is why there is no job list (unavailable: no job store).
	JobsError *codec.Error `json:"jobs_error,omitempty"`
	// P95History is each class's p95 of the last minute, one point every
	// P95HistoryStepMS, oldest first; null where the minute had no result.
	P95History       map[string][]*float64 `json:"p95_history"`
	P95HistoryStepMS int64                 `json:"p95_history_step_ms"`
}

// newEventStreams serves a's snapshots and streams, with at most maxStreams streams.
func newEventStreams(a *httpAPI, history func() map[string][]float64, maxStreams int) *eventStreams {
	return &eventStreams{a: a, history: history, slots: make(chan struct{}, max(1, maxStreams)), done: make(chan struct{}),
		memos: map[string]*snapshotMemo{}}
}

// close ends every stream (the server's shutdown).
func (es *eventStreams) close() { es.once.Do(func() { close(es.done) }) }

// snapshot is account's snapshot, made now or shared (rule 2).
func (es *eventStreams) snapshot(account string) ([]byte, *codec.Error) {
	es.mu.Lock()
	m := es.memos[account]
	if m == nil {
		m = &snapshotMemo{}
		es.memos[account] = m
	}
	es.mu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if now := time.Now(); m.at.IsZero() || now.Sub(m.at) >= snapshotReuse {
		m.body, m.err = es.make(account)
		m.at = now
	}
	return m.body, m.err
}

// make makes account's snapshot (rule 1).
func (es *eventStreams) make(account string) ([]byte, *codec.Error) {
	ctx, cancel := context.WithTimeout(context.Background(), snapshotBound)
	defer cancel()
	snap := pageSnapshot{NowUnixMS: time.Now().UnixMilli(), Account: account, P95HistoryStepMS: (classHistoryStep * classTick).Milliseconds()}
	var e *codec.Error
	if snap.Status, e = es.call(ctx, subjects.OpStatus, account); e != nil {
		return nil, e
	}
	snap.Jobs, snap.JobsError = es.call(ctx, subjects.OpJobList, account)
	snap.P95History = map[string][]*float64{}
	if es.history != nil {
		for class, h := range es.history() {
			points := make([]*float64, len(h))
			for i, v := range h {
				if !math.IsNaN(v) {
					v := round3(v)
					points[i] = &v
				}
			}
			snap.P95History[class] = points
		}
	}
	b, err := json.Marshal(&snap)
	if err != nil {
		return nil, codec.Errorf(codec.CodeInternal, "encode the snapshot: %v", err)
	}
	return b, nil
}

// call serves op (no body) for account through the API, as an HTTP request would be.
func (es *eventStreams) call(ctx context.Context, op, account string) (json.RawMessage, *codec.Error) {
	res := make(chan httpResult, 1)
	es.a.svc.serve(ctx, op, []byte("{}"), true, account, func(b []byte, e *codec.Error) {
		select {
		case res <- httpResult{b, e}:
		default:
		}
	})
	select {
	case r := <-res:
		return r.body, r.err
	case <-ctx.Done():
		return nil, codec.Errorf(codec.CodeUnavailable, "%s did not answer within %v", op, snapshotBound)
	}
}

// serveSnapshot answers GET /v1/snapshot: one snapshot (rule 4: it takes an API slot).
func (es *eventStreams) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	select {
	case es.a.slots <- struct{}{}:
		defer func() { <-es.a.slots }()
	default:
		httpError(w, http.StatusTooManyRequests, codec.Errorf(codec.CodeOverloaded,
			"over %d HTTP requests in progress (gateway.http_max_concurrent)", cap(es.a.slots)))
		return
	}
	body, e := es.snapshot(callerOf(r.Context()))
	w.Header().Set("Cache-Control", "no-store")
	httpWrite(w, httpResult{body, e})
}

// serveStream answers GET /v1/events: the stream of rule 3, within the bound of rule 4.
func (es *eventStreams) serveStream(w http.ResponseWriter, r *http.Request) {
	select {
	case es.slots <- struct{}{}:
		defer func() { <-es.slots }()
	default:
		httpError(w, http.StatusTooManyRequests, codec.Errorf(codec.CodeOverloaded,
			"over %d event streams open", cap(es.slots)).With("limit", cap(es.slots)))
		return
	}
	account := callerOf(r.Context())
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no")
	send := func(event string, data []byte) bool {
		rc.SetWriteDeadline(time.Now().Add(eventWriteBound))
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	rc.SetWriteDeadline(time.Now().Add(eventWriteBound))
	if _, err := fmt.Fprintf(w, "retry: %d\n\n", eventRetryMS); err != nil {
		return
	}
	tick := time.NewTicker(eventEvery)
	defer tick.Stop()
	for {
		body, e := es.snapshot(account)
		ok := false
		if e != nil {
			b, _ := json.Marshal(e)
			ok = send("error", b)
		} else {
			ok = send("snapshot", body)
		}
		if !ok {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-es.done:
			return
		case <-tick.C:
		}
	}
}
