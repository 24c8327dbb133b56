package cache

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

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// StreamName is the JetStream stream of the cache's entries.
const StreamName = "ORTBUS_CACHE"

// evictTo: an eviction pass purges the oldest entries until the stream holds about this
// share of its bound.
const evictTo = 0.8

// Store is the cache's entries in JetStream. Safe for concurrent use.
type Store struct {
	js       jetstream.JetStream
	stream   jetstream.Stream
	maxBytes int64
	log      *slog.Logger

	evictMu sync.Mutex

	hits, misses, corrupt, writes, evictions atomic.Uint64
}

// Open creates or updates the stream with cfg's bounds (every gateway does it at start).
func Open(ctx context.Context, nc *nats.Conn, cfg config.Cache, log *slog.Logger) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:              StreamName,
		Description:       "ortbus: the result cache, one answer per subject",
		Subjects:          []string{subjects.CachePrefix + ".>"},
		Retention:         jetstream.LimitsPolicy,
		MaxBytes:          int64(cfg.MaxBytes),
		MaxAge:            cfg.MaxAge.D(),
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardNew,
		Replicas:          max(1, cfg.Replicas),
		AllowDirect:       true,
	})
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", StreamName, err)
	}
	return &Store{js: js, stream: st, maxBytes: int64(cfg.MaxBytes), log: log}, nil
}

// Get returns the answer stored under k, or false: not there, written before since,
// unreadable (corrupt, truncated, another key's: counted corrupt), or JetStream did not
// answer. Never an error: a miss.
func (s *Store) Get(ctx context.Context, k Key, since time.Time) (body []byte, ok bool) {
	subj := k.Subject()
	m, err := s.stream.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		s.misses.Add(1)
		return nil, false
	}
	e, err := decodeEntry(m.Data, k.Digest())
	if err != nil {
		s.misses.Add(1)
		s.corrupt.Add(1)
		s.log.Warn("cache entry unreadable: dropped, answered as a miss", "subject", subj, "err", err)
		if perr := s.stream.Purge(context.WithoutCancel(ctx), jetstream.WithPurgeSubject(subj)); perr != nil {
			s.log.Debug("drop an unreadable cache entry", "err", perr)
		}
		return nil, false
	}
	if e.Created < since.UnixMilli() {
		s.misses.Add(1)
		return nil, false
	}
	s.hits.Add(1)
	return e.Body, true
}

// Hit counts an answer served from another request's computation (a flight): a hit.
func (s *Store) Hit() { s.hits.Add(1) }

// Miss counts a lookup that did not reach Get (the file or the model could not be
// hashed): a miss too.
func (s *Store) Miss() { s.misses.Add(1) }

// Put stores body (the op's reply, msgpack) under k. A write the stream refuses for room
// evicts the oldest entries and is tried once more; any other failure leaves the answer
// uncached (logged): the cache never fails a request.
func (s *Store) Put(ctx context.Context, k Key, body []byte) error {
	data, err := encodeEntry(k.Digest(), time.Now().UnixMilli(), body)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(k.Subject())
	msg.Data = data
	for try := 0; ; try++ {
		_, err = s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(StreamName))
		if err == nil {
			s.writes.Add(1)
			return nil
		}
		if try > 0 || !full(err) {
			return err
		}
		if err := s.evict(ctx, int64(len(data))); err != nil {
			return err
		}
	}
}

// full reports whether a publish was refused for room (the stream at max_bytes).
func full(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == 10077 && ae.Description == "maximum bytes exceeded" // JSStreamStoreFailedF, store.ErrMaxBytes
}

// evict purges the oldest written entries until the stream holds about evictTo of its
// bound less need: it reads the stream's state, estimates from the mean entry size the
// sequence below which that many bytes lie, and purges everything below it in one call.
// One pass at a time in this gateway.
func (s *Store) evict(ctx context.Context, need int64) error {
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	info, err := s.stream.Info(ctx)
	if err != nil {
		return err
	}
	st := info.State
	target := int64(float64(s.maxBytes)*evictTo) - need
	if st.Msgs == 0 || int64(st.Bytes) <= target {
		return nil // another pass made room meanwhile
	}
	drop := float64(int64(st.Bytes)-target) / float64(st.Bytes) // share of the entries
	span := float64(st.LastSeq - st.FirstSeq + 1)
	cut := st.FirstSeq + uint64(drop*span) + 1
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSequence(cut)); err != nil {
		return err
	}
	after, err := s.stream.Info(ctx)
	if err == nil && after.State.Msgs < st.Msgs {
		s.evictions.Add(st.Msgs - after.State.Msgs)
	}
	return nil
}

// Purge removes the entries under filter (Filter, RevisionFilter) and returns how many
// went (read from the stream's count before and after: approximate while others write).
func (s *Store) Purge(ctx context.Context, filter string) (uint64, error) {
	before, err := s.stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
		return 0, err
	}
	after, err := s.stream.Info(ctx)
	if err != nil || after.State.Msgs > before.State.Msgs {
		return 0, err
	}
	return before.State.Msgs - after.State.Msgs, nil
}

// Counters are this gateway's counts since it started.
type Counters struct {
	Hits, Misses, Corrupt, Writes, Evictions uint64
}

// Counters reads them.
func (s *Store) Counters() Counters {
	return Counters{Hits: s.hits.Load(), Misses: s.misses.Load(), Corrupt: s.corrupt.Load(), Writes: s.writes.Load(), Evictions: s.evictions.Load()}
}

// MaxBytes is the stream's bound.
func (s *Store) MaxBytes() int64 { return s.maxBytes }

// Usage reads the stream's entries and bytes.
func (s *Store) Usage(ctx context.Context) (entries, bytes uint64, err error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	return info.State.Msgs, info.State.Bytes, nil
}

// Count counts the entries under filter (an ephemeral consumer's pending count).
func (s *Store) Count(ctx context.Context, filter string) (uint64, error) {
	c, err := s.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     filter,
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		InactiveThreshold: 10 * time.Second,
		MemoryStorage:     true,
	})
	if err != nil {
		return 0, err
	}
	defer s.stream.DeleteConsumer(context.WithoutCancel(ctx), c.CachedInfo().Name)
	return c.CachedInfo().NumPending, nil
}
