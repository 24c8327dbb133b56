// Package jobs keeps library-scale batch jobs in JetStream, so that a job outlives any
// gateway, worker or NATS server that dies while it runs.
//
// A job is one op over a list of image paths. Its parts, all in JetStream:
//
//   - the job's record, in the key-value bucket ortbus_jobs (JSON, one key per job: its
//     spec, its total, when it was created and cancelled);
//   - its items, one message each on ortbus.job.item.<job> in the work-queue stream
//     ORTBUS_JOB_ITEMS (Nats-Msg-Id <job>:<n>, so a re-submit adds nothing), consumed by
//     every gateway through one durable pull consumer;
//   - its results, one message per item on ortbus.job.result.<job>.<n> in the stream
//     ORTBUS_JOB_RESULTS, which keeps one message per subject and refuses a second: an
//     item has exactly one result however often it is delivered;
//   - the marks of its runs, ortbus.job.run.<job>.<n>.<k> (k = 1, 2) in the same stream,
//     each taken before the item is sent to a worker.
//
// The rules an item follows, wherever it is delivered (handle, consume.go):
//
//  1. An item with a result is acknowledged and not run again.
//  2. An item of a cancelled, failed or unknown job is acknowledged and not run.
//  3. Before it runs, an item takes its next run mark; an item whose two marks are taken
//     (it was running when its gateway, or the whole stack, died twice) is answered
//     poison_input without running: no item runs more than twice. A run stopped by its
//     gateway's graceful stop gives its mark back, and the item is handed on at once.
//  4. While it runs (and while its mark and result are written), its gateway tells
//     JetStream so every third of ack_wait; a gateway that dies stops doing so, and the
//     item is delivered again after ack_wait.
//  5. Errors that say nothing about the item (no worker, overloaded, a worker lost once)
//     are retried by the gateway that holds it, after a pause, for as long as the job
//     runs; any other outcome is the item's result.
//  6. The result is recorded before the item is acknowledged.
//  7. Storage never stalls a job (refuse.go). A run mark or result the store refuses for
//     good (the results stream, or JetStream's storage, is full) fails the job: its state
//     is failed with the reason, its waiting items are removed and none of it runs any
//     more. A result refused for its size alone is recorded as the item's error
//     reply_too_large instead. Any other failure (no answer, a leader being elected) is
//     retried for ack_wait (at least storeRetryMin), then fails the job as unavailable;
//     where even that cannot be recorded, the item is left to be delivered again, and
//     rule 3 still bounds its runs.
//  8. An item of a paused job (job.pause) is parked unrun, before it takes a run mark:
//     written to the bucket ortbus_jobs_parked and acknowledged, so that it leaves the
//     work queue and the other jobs' items run; job.resume publishes the job's parked
//     items again (park.go). Its items running when it was paused finish.
//  9. Outside the quiet hours ([jobs] windows) an item of a job not submitted anytime is
//     parked the same way; when a window opens (and when a gateway starts inside one),
//     the gateway publishes again the parked items of every job neither paused nor
//     finished. A gateway fetches items outside the windows only while it knows of an
//     anytime job not finished (AnytimeKnown); otherwise they wait in the work queue.
//
// Counts (done, failed, redelivered) are read from the results themselves, so every
// gateway reports the same figures and none is lost with a gateway.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// Names of the JetStream objects.
const (
	ItemsStream   = "ORTBUS_JOB_ITEMS"
	ResultsStream = "ORTBUS_JOB_RESULTS"
	Bucket        = "ortbus_jobs"
	ConsumerName  = "ortbus-gateways"
)

// Runner runs one item through the gateway (its queues, sharing policy and workers) and
// returns the op's reply, msgpack-encoded, or an error. ctx ends when the item's job is
// cancelled or the gateway stops; the runner then answers soon (cancelled).
type Runner func(ctx context.Context, it Item) ([]byte, *codec.Error)

// Item is one delivered item of a job.
type Item struct {
	Job   *Record
	Index int
	Path  string
	// Run is this item's run (1, or 2 when it was running where a gateway died).
	Run int
	// cached is set by FromCache.
	cached *bool
}

// FromCache tells the store that the runner answered the item from the result cache
// (its result line then says "cached": true, and the job's status counts it cached).
func (it Item) FromCache() {
	if it.cached != nil {
		*it.cached = true
	}
}

// ItemIDPrefix starts the request id of every job item; clients may not use it.
const ItemIDPrefix = "job:"

// ID is the request id the item runs under: job:<job>:<n>.
func (it Item) ID() string { return fmt.Sprintf("%s%s:%d", ItemIDPrefix, it.Job.Job, it.Index) }

// Record is a job as kept in the bucket (`nats kv get ortbus_jobs JOB` shows it).
type Record struct {
	// Job is the job's key (owner.go): its owner's id for the local owner, a hash of the
	// account and its id for an account.
	Job string `json:"job"`
	// Name is an account's own id for the job (owner.go), which it names and sees it by;
	// empty for the local owner's jobs, whose key is their id.
	Name string `json:"name,omitempty"`
	// Owner is the account that submitted it (the gateway's identity rules): only it, or
	// the local owner "", sees, reads or cancels the job.
	Owner string `json:"owner,omitempty"`
	// Items is a digest of the job's item paths, so that a re-submit of the id with other
	// items is told apart (conflict) rather than answered with this job's results.
	Items   string         `json:"items,omitempty"`
	Op      string         `json:"op"`
	Model   string         `json:"model,omitempty"`
	Class   string         `json:"class"`
	Pool    string         `json:"pool,omitempty"`
	Options *codec.Request `json:"options,omitempty"`
	Total   int            `json:"total"`
	Created int64          `json:"created_unix_ms"`
	Cancel  int64          `json:"cancelled_unix_ms,omitempty"`
	// Failed is when the job failed (rule 7), Reason why.
	Failed int64        `json:"failed_unix_ms,omitempty"`
	Reason *codec.Error `json:"reason,omitempty"`
	// Incremental: items whose answer the result cache holds are answered from it.
	Incremental bool `json:"incremental,omitempty"`
	// Paused is when its owner paused it (job.pause), 0 when it runs: its delivered items
	// are parked unrun (rule 8, park.go) until job.resume.
	Paused int64 `json:"paused_unix_ms,omitempty"`
	// Anytime: its items run outside [jobs] windows too (rule 9).
	Anytime bool `json:"anytime,omitempty"`
	// Skipped and SkippedTotal: the entries of a directory submit that are no items, with
	// their reasons (Listing), kept for job.status. Not part of the job's identity: a
	// re-submit compares the items, not what was left out.
	Skipped      []codec.JobSkip `json:"skipped,omitempty"`
	SkippedTotal int             `json:"skipped_total,omitempty"`
}

// finished reports whether the job was cancelled or failed: none of its items runs any more.
func (r *Record) finished() bool { return r.Cancel != 0 || r.Failed != 0 }

// Store is this gateway's handle on the jobs: the API's reads and writes, and the
// consumer that runs items.
type Store struct {
	cfg     config.Jobs
	log     *slog.Logger
	js      jetstream.JetStream
	items   jetstream.Stream
	results jetstream.Stream
	cons    jetstream.Consumer
	kv      jetstream.KeyValue
	parked  jetstream.KeyValue // items of paused jobs (park.go)

	mu      sync.Mutex
	records map[string]*Record // cache of the bucket, bounded by maxCached
	anytime map[string]bool    // the anytime jobs not finished that this gateway knows of (rule 9)
	now     func() time.Time   // the windows' clock (a test's own)
	tallies map[string]*tally  // counts read from the results, bounded by maxCached
	running map[string]map[int]context.CancelFunc
	held    int // items delivered here and not yet finished
	wake    chan struct{}
	acked   atomic.Uint64 // items this gateway settled

	// storeRetry bounds the retries of a write the store did not take for a transient
	// reason (rule 7): ack_wait, at least storeRetryMin.
	storeRetry time.Duration
}

// ErrNoJetStream: the NATS server has no JetStream (for the embedded server, set
// nats.store_dir); the job API answers unavailable.
var ErrNoJetStream = errors.New("the NATS server has no JetStream (embedded: set nats.store_dir)")

// maxCached bounds the records and tallies held in memory; past it, entries are read
// again from JetStream when needed.
const maxCached = 4096

// Open creates or updates the streams, the bucket and the consumer (idempotently: every
// gateway does it at start, with the limits of its config) and returns the store.
func Open(ctx context.Context, nc *nats.Conn, cfg config.Jobs, log *slog.Logger) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return nil, ErrNoJetStream
		}
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	s := &Store{cfg: cfg, log: log, js: js, records: map[string]*Record{}, anytime: map[string]bool{}, now: time.Now, tallies: map[string]*tally{},
		running: map[string]map[int]context.CancelFunc{}, wake: make(chan struct{}, 1),
		storeRetry: max(cfg.AckWait.D(), storeRetryMin)}
	if s.items, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        ItemsStream,
		Description: "ortbus: job items waiting to run",
		Subjects:    []string{subjects.JobItemPrefix + ".>"},
		Retention:   jetstream.WorkQueuePolicy,
		MaxBytes:    int64(cfg.ItemsMaxBytes),
		Discard:     jetstream.DiscardNew,
		Replicas:    cfg.Replicas,
		Duplicates:  10 * time.Minute,
	}); err != nil {
		return nil, fmt.Errorf("stream %s: %w", ItemsStream, err)
	}
	if s.results, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:                 ResultsStream,
		Description:          "ortbus: one result per job item, and the marks of item runs",
		Subjects:             []string{subjects.JobResultPrefix + ".>", subjects.JobRunPrefix + ".>"},
		Retention:            jetstream.LimitsPolicy,
		MaxBytes:             int64(cfg.ResultsMaxBytes),
		MaxAge:               cfg.ResultsMaxAge.D(),
		MaxMsgsPerSubject:    1,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		Replicas:             cfg.Replicas,
		AllowDirect:          true,
	}); err != nil {
		return nil, fmt.Errorf("stream %s: %w", ResultsStream, err)
	}
	if s.kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "ortbus: job records",
		TTL:         cfg.ResultsMaxAge.D(),
		Replicas:    cfg.Replicas,
		History:     1,
	}); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", Bucket, err)
	}
	if s.parked, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      ParkedBucket,
		Description: "ortbus: the waiting items of paused jobs",
		TTL:         cfg.ResultsMaxAge.D(),
		MaxBytes:    int64(cfg.ItemsMaxBytes),
		Replicas:    cfg.Replicas,
		History:     1,
	}); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", ParkedBucket, err)
	}
	if s.cons, err = s.items.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		Description:   "ortbus gateways: job items",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait.D(),
		MaxAckPending: cfg.MaxAckPending,
		MaxDeliver:    -1, // rule 3 bounds runs; a delivery that did not run costs nothing
	}); err != nil {
		return nil, fmt.Errorf("consumer %s: %w", ConsumerName, err)
	}
	if len(cfg.Windows) > 0 {
		s.loadAnytime(ctx)
	}
	return s, nil
}

// loadAnytime reads the records kept for the anytime jobs not finished (rule 9): those
// submitted before this gateway started.
func (s *Store) loadAnytime(ctx context.Context) {
	lister, err := s.kv.ListKeys(ctx)
	if err != nil {
		if !errors.Is(err, jetstream.ErrNoKeysFound) {
			s.log.Warn("read the job records for anytime jobs", "err", err)
		}
		return
	}
	defer lister.Stop()
	for k := range lister.Keys() {
		if e, err := s.kv.Get(ctx, k); err == nil {
			if r, err := decodeRecord(e.Value()); err == nil && r.Anytime && !r.finished() {
				s.mu.Lock()
				s.anytime[r.Job] = true
				s.mu.Unlock()
			}
		}
	}
}

// AnytimeKnown reports whether this gateway knows of an anytime job not finished: it then
// fetches items outside the windows too (rule 9). A nil store knows of none.
func (s *Store) AnytimeKnown() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.anytime) > 0
}

// holds reports whether rec's items are held unrun now: paused (rule 8), or outside the
// windows and not anytime (rule 9).
func (s *Store) holds(rec *Record) bool {
	return rec.Paused != 0 || !rec.Anytime && !s.cfg.InWindow(s.now())
}

// Unavailable is the job API's answer where the store could not be opened.
func Unavailable() *codec.Error { return codec.Errorf(codec.CodeUnavailable, "%v", ErrNoJetStream) }

// record returns job's record, from the cache or the bucket (nil, nil when unknown).
func (s *Store) record(ctx context.Context, job string) (*Record, error) {
	s.mu.Lock()
	r, ok := s.records[job]
	s.mu.Unlock()
	if ok {
		return r, nil
	}
	e, err := s.kv.Get(ctx, job)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r, err = decodeRecord(e.Value())
	if err != nil {
		return nil, err
	}
	s.cache(r)
	return r, nil
}

func (s *Store) cache(r *Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.records[r.Job]; !ok && len(s.records) >= maxCached {
		for k := range s.records { // any one: it is read again when needed
			delete(s.records, k)
			break
		}
	}
	s.records[r.Job] = r
	if r.Anytime && !r.finished() {
		s.anytime[r.Job] = true
	} else {
		delete(s.anytime, r.Job)
	}
}
