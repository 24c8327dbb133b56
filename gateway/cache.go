package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ortbus/ortbus/cache"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/subjects"
)

// The gateway's side of the result cache (package cache: the key, the storage, eviction
// and the rule for files). Where it sits in a request's life:
//
//  1. Before a request enters the lifecycle (submitFrom, runJobItem): a cacheable request
//     (cache.Cacheable op, a model known before dispatch, not cache: false, the cache on
//     and its store open) is looked up: its model's revision, its file's hash (the stat
//     key first), the entry. A hit is answered at once by the lifecycle (L1: its one
//     terminal answer, never queued, unless the client's cancel came first), with
//     timing.cached and total_us the lookup.
//  2. A miss joins its key's flight (cache.Flights): the first request of a key runs; one
//     that comes while it runs waits for its answer and is answered as a hit.
//  3. After its answer (the Reply the lifecycle delivers, or the job runner's answer), a
//     result is stored, if the file's stat key and the model's revision are still those
//     of the lookup; the flight ends either way. Nothing here holds lifecycle state: the
//     ticket rides on the pending (set before acceptance, L1) and on the reply closure.
//
// Lookups and stores are bounded (cacheLookupsAtOnce, cachePutsAtOnce): past the bound a
// request goes without the cache rather than wait. Any failure of the cache is a miss.

const (
	// cacheLookupsAtOnce bounds the interactive lookups running at once.
	cacheLookupsAtOnce = 64
	// cachePutsAtOnce bounds the stores of interactive answers running at once.
	cachePutsAtOnce = 64
	// cacheIOBound bounds one JetStream read or write of the cache.
	cacheIOBound = 5 * time.Second
	// cacheOpsAtOnce bounds the cache API's requests being answered.
	cacheOpsAtOnce = 4
)

// cacheService is the gateway's side of the cache: its state (the hashers, the flights,
// the bounds, the store once open) is its own.
type cacheService struct {
	enabled bool          // [cache] enabled, at start
	files   *cache.Hasher // images: stat keys and content hashes
	models  *cache.Hasher // model files, apart, so that images never push them out
	flights cache.Flights
	lookups chan struct{}
	puts    chan struct{}
	ops     chan struct{}

	mu    sync.Mutex
	store *cache.Store      // nil until opened
	revs  map[string]string // model: the revision last seen, to purge the one before

	// What it needs of the rest of the gateway, wired at construction.
	conf    func() *config.Config
	log     *slog.Logger
	d       dispatchPort           // submits and answers requests (the dispatcher)
	workers func() []health.Worker // the tracker's workers: which revision each loaded
}

// requests is what the cache and job services need of the dispatcher (loop.go): a
// request submitted (resolved, then taken by the loop), a request answered that the loop
// never took, an event posted, and the loop's stop.
type dispatchPort interface {
	submit(p *pending)
	deliver(p *pending, pool string, body []byte, err *codec.Error)
	post(ev event)
	stopped() <-chan struct{}
}

// newCacheService is the cache service; where cfg's [cache] does not enable it, its
// store is never opened, and it takes no request (wanted). The store is opened with the
// job store (open).
func newCacheService(cfg *config.Config, conf func() *config.Config, log *slog.Logger, d dispatchPort, workers func() []health.Worker, reg prometheus.Registerer) *cacheService {
	c := &cacheService{conf: conf, log: log, d: d, workers: workers}
	cc := cfg.Cache
	if !cc.Enabled {
		return c
	}
	c.enabled = true
	c.files, c.models = cache.NewHasher(cc.StatEntries), cache.NewHasher(1024)
	c.lookups, c.puts = make(chan struct{}, cacheLookupsAtOnce), make(chan struct{}, cachePutsAtOnce)
	c.ops, c.revs = make(chan struct{}, cacheOpsAtOnce), map[string]string{}
	// Model files are the operator's, replaced whole and then reloaded, and may be large:
	// their stat key stands without the racy rule's wait, so that a lookup right after a
	// model's update does not read its weights again.
	c.models.Racy = 0
	reg.MustRegister(cacheCollector{c})
	return c
}

// open opens the cache's stream (JetStream is up: the job store opened).
func (c *cacheService) open(ctx context.Context, nc *nats.Conn) {
	if !c.enabled {
		return
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := cache.Open(octx, nc, c.conf().Cache, c.log)
	if err != nil {
		c.log.Warn("open the result cache; requests go without it", "err", err)
		return
	}
	c.mu.Lock()
	c.store = s
	c.mu.Unlock()
	c.log.Info("result cache open", "max_bytes", s.MaxBytes())
}

// storeOf returns the open store, or nil.
func (c *cacheService) storeOf() *cache.Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.store
}

// wanted reports whether p may use the cache at all.
func (c *cacheService) wanted(p *pending) bool {
	return c.storeOf() != nil && cache.Cacheable(p.op) && p.req.Path != "" && (p.req.Cache == nil || *p.req.Cache)
}

// model is the model that will answer p on pools: its own, else the one every pool
// gives the op (the pool's first model serving it); "" when the pools differ.
func (c *cacheService) model(p *pending, pools []string) string {
	if p.req.Model != "" {
		return p.req.Model
	}
	cfg := c.conf()
	model := ""
	for _, pool := range pools {
		first := ""
		for _, m := range cfg.Pool(pool).Models {
			if mc := cfg.Models[m]; mc != nil && contains(opsOfKind[mc.Kind], p.op) {
				first = m
				break
			}
		}
		if first == "" || model != "" && first != model {
			return ""
		}
		model = first
	}
	return model
}

// revision is model's revision (its files hashed, each version once); a revision that
// differs from the one last seen purges the entries of the one before, which are never
// served again (the revision is part of the key).
func (c *cacheService) revision(model string) (string, bool) {
	mc := c.conf().Models[model]
	if mc == nil {
		return "", false
	}
	rev, err := cache.Revision(c.models, mc)
	if err != nil {
		c.log.Debug("model revision: the cache is not used for it", "model", model, "err", err)
		return "", false
	}
	c.mu.Lock()
	old := c.revs[model]
	c.revs[model] = rev
	c.mu.Unlock()
	if old != "" && old != rev {
		if s := c.storeOf(); s != nil {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), cacheIOBound)
				defer cancel()
				n, err := s.Purge(ctx, cache.RevisionFilter(model, old))
				c.log.Info("model revision changed: its older entries purged", "model", model, "purged", n, "err", err)
			}()
		}
	}
	return rev, true
}

// lookup looks p up for owner (p resolved, pools its candidates): a hit's stored
// reply (msgpack, id cleared), or a ticket to store its answer with (nil: p goes without
// the cache). Entries written before since are not taken. A request whose key another
// request is computing waits for that answer (ctx bounds the wait).
func (c *cacheService) lookup(ctx context.Context, p *pending, pools []string, owner string, since time.Time) (*cacheTicket, []byte) {
	s := c.storeOf()
	model := c.model(p, pools)
	if s == nil || model == "" {
		return nil, nil
	}
	rev, ok := c.revision(model)
	if !ok {
		s.Miss()
		return nil, nil
	}
	t := c.key(p, model, rev, owner)
	if t == nil {
		s.Miss()
		return nil, nil
	}
	gctx, cancel := context.WithTimeout(ctx, cacheIOBound)
	body, ok := s.Get(gctx, t.key, since)
	cancel()
	if ok {
		return nil, body
	}
	digest := t.key.Digest()
	for {
		fl, leader := c.flights.Join(digest)
		if leader {
			t.shared = fl
			return t, nil
		}
		if body := fl.Wait(ctx); body != nil {
			s.Hit()
			return nil, body
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		// The leader had no answer to share (an error): lead the next try.
	}
}

// key hashes p's file (the stat key first) and returns p's key for owner on model's
// revision rev; nil when the file cannot be hashed (the worker answers its error).
func (c *cacheService) key(p *pending, model, rev, owner string) *cacheTicket {
	cfg := c.conf()
	policy := images.Policy{AllowedRoots: cfg.Security.AllowedRoots, MaxBytes: int64(cfg.Security.MaxImageBytes)}
	f, resolved, err := policy.OpenFile(p.req.Path)
	if err != nil {
		return nil
	}
	fs, err := c.files.SumFile(f, resolved, policy.MaxFileBytes())
	f.Close()
	if err != nil {
		return nil
	}
	return &cacheTicket{file: fs, key: cache.Key{Owner: owner, Op: p.op, Model: model, Revision: rev, Options: cache.OptionsOf(p.op, &p.req), Content: fs.Sum}}
}

// done ends t's flight with p's answer (msgpack; ok: a result) and stores a result,
// if its file and its model are still what t hashed and the worker that computed it
// loaded that revision (its heartbeat says which). It blocks on JetStream (cacheIOBound).
func (c *cacheService) done(t *cacheTicket, op string, body []byte, ok bool) {
	var stored []byte
	if ok {
		var served codec.Served
		stored, served = cacheBody(op, body)
		switch {
		case stored == nil:
		case served.Model != t.key.Model:
			stored = nil // another model answered (the worker's first ready one): not the key's
		case !c.computedOn(served, t.key.Revision):
			stored = nil // another revision answered
		case !c.files.Unchanged(t.file):
			stored = nil // the file changed while it ran: the answer is not the hashed bytes'
		default:
			if rev, ok := c.revision(t.key.Model); !ok || rev != t.key.Revision {
				stored = nil // the model changed while it ran: which revision answered is unknown
			}
		}
	}
	// What is not stored is not shared either: the requests waiting on the key run.
	if t.shared != nil {
		// Once stored: a request of the key that comes meanwhile waits for this answer
		// rather than find neither the flight nor the entry.
		defer c.flights.Finish(t.key.Digest(), t.shared, stored)
	}
	s := c.storeOf()
	if stored == nil || s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cacheIOBound)
	defer cancel()
	if err := s.Put(ctx, t.key, stored); err != nil {
		c.log.Debug("store an answer in the cache", "err", err)
	}
}

// computedOn reports whether the worker that answered (served) had loaded revision rev
// of its model, as its last heartbeat says: false when it says another one (its files
// were replaced and it was not reloaded yet, or it loaded an older version); true when it
// says none (it could not hash them, or it is gone: then the files, hashed again before
// the store, decide).
func (c *cacheService) computedOn(served codec.Served, rev string) bool {
	for _, w := range c.workers() {
		if w.HB.Worker != served.Worker {
			continue
		}
		for _, m := range w.HB.Models {
			if m.Name == served.Model && m.Revision != "" {
				return m.Revision == rev
			}
		}
	}
	return true
}

// cacheBody is a worker's reply (msgpack) as stored: the same reply, its id cleared, and
// who served it; nil when it does not decode as op's reply.
func cacheBody(op string, body []byte) ([]byte, codec.Served) {
	rep, ok := codec.NewReply(op).(codec.Replier)
	if !ok || codec.Unmarshal(body, rep) != nil {
		return nil, codec.Served{}
	}
	served := *rep.Meta()
	rep.Meta().ID = ""
	b, err := codec.Marshal(rep)
	if err != nil {
		return nil, codec.Served{}
	}
	return b, served
}

// cachedReply is a stored reply answered to request id: its id set, its timing the
// lookup's (cached, total_us from accepted). nil when it does not decode.
func cachedReply(op string, body []byte, id string, accepted time.Time) codec.Replier {
	rep, ok := codec.NewReply(op).(codec.Replier)
	if !ok || codec.Unmarshal(body, rep) != nil {
		return nil
	}
	m := rep.Meta()
	m.ID = id
	m.Timing = codec.Timing{TotalUS: time.Since(accepted).Microseconds(), Cached: true}
	return rep
}

// front runs a client's request through the cache before it enters the lifecycle,
// in a goroutine of its own (a lookup reads the file and JetStream), and reports whether
// it took the request; false: submit it as usual. p is decoded, validated, its id set.
func (c *cacheService) front(p *pending) bool {
	if !c.wanted(p) {
		return false
	}
	select {
	case c.lookups <- struct{}{}:
	default:
		return false // lookups are at their bound: this one goes without
	}
	go func() {
		defer func() { <-c.lookups }()
		defer guard.Recover(c.log, "cache lookup", func(e *codec.Error) {
			if !p.answered.Load() {
				c.d.deliver(p, "", nil, e)
			}
		})
		pools, e := resolve(c.conf(), p)
		if e != nil {
			c.d.submit(p) // answers the error
			return
		}
		ctx, cancel := context.WithDeadline(context.Background(), p.deadline)
		start := time.Now()
		t, hit := c.lookup(ctx, p, pools, p.account, time.Time{})
		cancel()
		traceLookup(p, start, hit != nil)
		if hit != nil {
			id := p.id
			if p.clientID != "" {
				id = p.clientID
			}
			if rep := cachedReply(p.op, hit, id, p.accepted); rep != nil {
				if b, err := codec.Encode(rep, p.asJSON); err == nil {
					// Answered by the lifecycle (L1), which knows of the client's
					// cancels: one sent before the request wins over the hit.
					p.hit = b
					c.d.post(evAccept{p: p})
					return
				}
			}
		}
		if t != nil {
			p.cacheTicket = t
			reply := p.reply
			p.reply = func(body []byte, e *codec.Error) {
				reply(body, e)
				c.after(p, t, body, e == nil)
			}
		}
		c.d.submit(p)
	}()
	return true
}

// after stores an interactive request's answer (body as its client got it), off
// the sender's goroutine, within cachePutsAtOnce; past the bound only its flight ends.
func (c *cacheService) after(p *pending, t *cacheTicket, body []byte, ok bool) {
	if ok && p.asJSON {
		rep := codec.NewReply(p.op)
		if codec.Decode(body, rep, true) != nil {
			ok = false
		} else if body, _ = codec.Marshal(rep); body == nil {
			ok = false
		}
	}
	select {
	case c.puts <- struct{}{}:
		go func() {
			defer func() { <-c.puts }()
			c.done(t, p.op, body, ok)
		}()
	default:
		c.done(t, p.op, nil, false)
	}
}

// serve answers cache.stats and cache.purge for account, who reaches only its own
// entries (the local owner "" every owner's).
func (c *cacheService) serve(op string, data []byte, asJSON bool, account string, reply Reply) {
	var req codec.CacheRequest
	if len(data) > 0 {
		if e := decodeChecked(data, &req, asJSON, req.Validate); e != nil {
			reply(nil, e)
			return
		}
	}
	if req.Model != "" {
		if _, ok := c.conf().Models[req.Model]; !ok {
			reply(nil, codec.Errorf(codec.CodeUnknownModel, "model %q is not configured", req.Model).With("model", req.Model))
			return
		}
	}
	s := c.storeOf()
	if s == nil {
		b, _ := codec.Encode(&codec.CacheStats{}, asJSON)
		reply(b, nil) // no cache here: enabled false
		return
	}
	select {
	case c.ops <- struct{}{}:
	default:
		reply(nil, codec.Errorf(codec.CodeOverloaded, "%d cache requests are being answered; try again", cacheOpsAtOnce))
		return
	}
	go func() {
		defer func() { <-c.ops }()
		defer guard.Recover(c.log, "cache "+op, func(e *codec.Error) { reply(nil, e) })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st := &codec.CacheStats{}
		if op == subjects.OpCachePurge {
			n, err := s.Purge(ctx, cache.Filter(req.Model, account, account == ""))
			if err != nil {
				reply(nil, codec.Errorf(codec.CodeUnavailable, "purge the cache: %v", err))
				return
			}
			st.Purged = n
		}
		if e := c.stats(ctx, s, st, req.Model, account); e != nil {
			reply(nil, e)
			return
		}
		b, err := codec.Encode(st, asJSON)
		if err != nil {
			reply(nil, codec.Errorf(codec.CodeInternal, "%v", err))
			return
		}
		reply(b, nil)
	}()
}

// stats fills st: the bucket's figures (for account, and model when named: a count
// of their entries only) and this gateway's counters.
func (c *cacheService) stats(ctx context.Context, s *cache.Store, st *codec.CacheStats, model, account string) *codec.Error {
	st.Enabled, st.MaxBytes = true, s.MaxBytes()
	var err error
	if account == "" && model == "" {
		st.Entries, st.Bytes, err = s.Usage(ctx)
	} else {
		st.Entries, err = s.Count(ctx, cache.Filter(model, account, account == ""))
	}
	if err != nil {
		return codec.Errorf(codec.CodeUnavailable, "read the cache: %v", err)
	}
	k, h := s.Counters(), c.files.Stats()
	st.Hits, st.Misses, st.Corrupt, st.Writes, st.Evictions = k.Hits, k.Misses, k.Corrupt, k.Writes, k.Evictions
	st.Stats, st.Hashed, st.HashBytes = h.Stats, h.Hashed, h.HashBytes
	st.StatMS, st.HashMS = float64(h.StatNS)/1e6, float64(h.HashNS)/1e6
	return nil
}

// cacheCollector reports the cache's figures on /metrics.
type cacheCollector struct{ c *cacheService }

var (
	descCacheHits      = prometheus.NewDesc("ortbus_cache_hits_total", "Requests and job items answered from the result cache.", nil, nil)
	descCacheMisses    = prometheus.NewDesc("ortbus_cache_misses_total", "Cache lookups that found no usable entry.", nil, nil)
	descCacheCorrupt   = prometheus.NewDesc("ortbus_cache_corrupt_total", "Cache entries unreadable (corrupt, truncated), taken as misses.", nil, nil)
	descCacheWrites    = prometheus.NewDesc("ortbus_cache_writes_total", "Answers stored in the cache.", nil, nil)
	descCacheEvictions = prometheus.NewDesc("ortbus_cache_evictions_total", "Cache entries evicted for room (max_bytes).", nil, nil)
	descCacheBytes     = prometheus.NewDesc("ortbus_cache_bytes", "Bytes the cache's stream holds.", nil, nil)
	descCacheEntries   = prometheus.NewDesc("ortbus_cache_entries", "Entries the cache's stream holds.", nil, nil)
	descCacheHashed    = prometheus.NewDesc("ortbus_cache_files_hashed_total", "Files hashed (their stat key was not known or not trusted).", nil, nil)
	descCacheHashSecs  = prometheus.NewDesc("ortbus_cache_hash_seconds_total", "Time spent hashing files.", nil, nil)
	descCacheStatSecs  = prometheus.NewDesc("ortbus_cache_stat_seconds_total", "Time spent reading files' stat keys.", nil, nil)
)

func (c cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCacheHits, descCacheMisses, descCacheCorrupt, descCacheWrites, descCacheEvictions, descCacheBytes, descCacheEntries, descCacheHashed, descCacheHashSecs, descCacheStatSecs} {
		ch <- d
	}
}

func (c cacheCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.c.storeOf()
	if s == nil {
		return
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	k, h := s.Counters(), c.c.files.Stats()
	counter(descCacheHits, float64(k.Hits))
	counter(descCacheMisses, float64(k.Misses))
	counter(descCacheCorrupt, float64(k.Corrupt))
	counter(descCacheWrites, float64(k.Writes))
	counter(descCacheEvictions, float64(k.Evictions))
	counter(descCacheHashed, float64(h.Hashed))
	counter(descCacheHashSecs, float64(h.HashNS)/1e9)
	counter(descCacheStatSecs, float64(h.StatNS)/1e9)
	ctx, cancel := context.WithTimeout(context.Background(), jobStatsBound)
	defer cancel()
	if n, b, err := s.Usage(ctx); err == nil {
		ch <- prometheus.MustNewConstMetric(descCacheBytes, prometheus.GaugeValue, float64(b))
		ch <- prometheus.MustNewConstMetric(descCacheEntries, prometheus.GaugeValue, float64(n))
	}
}
