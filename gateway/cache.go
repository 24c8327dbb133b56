package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ortbus/ortbus/cache"
	"github.com/ortbus/ortbus/codec"
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

// cacheService is the gateway's handle on the cache.
type cacheService struct {
	files   *cache.Hasher // images: stat keys and content hashes
	models  *cache.Hasher // model files, apart, so that images never push them out
	flights cache.Flights
	lookups chan struct{}
	puts    chan struct{}
	ops     chan struct{}

	mu    sync.Mutex
	store *cache.Store      // nil until opened
	revs  map[string]string // model: the revision last seen, to purge the one before
}

// cacheTicket is a looked-up request's key, what its file hashed as, and its flight when
// it leads one.
type cacheTicket struct {
	key    cache.Key
	file   cache.FileSum
	flight *cache.Flight
}

// initCache makes the cache service when [cache] enables it; the store is opened with
// the job store (openCache).
func (g *Gateway) initCache() {
	cfg := g.conf().Cache
	if !cfg.Enabled {
		return
	}
	g.cache = &cacheService{files: cache.NewHasher(cfg.StatEntries), models: cache.NewHasher(1024),
		lookups: make(chan struct{}, cacheLookupsAtOnce), puts: make(chan struct{}, cachePutsAtOnce),
		ops: make(chan struct{}, cacheOpsAtOnce), revs: map[string]string{}}
	// Model files are the operator's, replaced whole and then reloaded, and may be large:
	// their stat key stands without the racy rule's wait, so that a lookup right after a
	// model's update does not read its weights again.
	g.cache.models.Racy = 0
	g.metrics.reg.MustRegister(cacheCollector{g})
}

// openCache opens the cache's stream (JetStream is up: the job store opened).
func (g *Gateway) openCache(ctx context.Context) {
	if g.cache == nil {
		return
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := cache.Open(octx, g.nc, g.conf().Cache, g.log)
	if err != nil {
		g.log.Warn("open the result cache; requests go without it", "err", err)
		return
	}
	g.cache.mu.Lock()
	g.cache.store = s
	g.cache.mu.Unlock()
	g.log.Info("result cache open", "max_bytes", s.MaxBytes())
}

// storeOf returns the open store, or nil.
func (c *cacheService) storeOf() *cache.Store {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.store
}

// cacheWanted reports whether p may use the cache at all.
func (g *Gateway) cacheWanted(p *pending) bool {
	return g.cache.storeOf() != nil && cache.Cacheable(p.op) && p.req.Path != "" && (p.req.Cache == nil || *p.req.Cache)
}

// cacheModel is the model that will answer p on pools: its own, else the one every pool
// gives the op (the pool's first model serving it); "" when the pools differ.
func (g *Gateway) cacheModel(p *pending, pools []string) string {
	if p.req.Model != "" {
		return p.req.Model
	}
	cfg := g.conf()
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
func (g *Gateway) revision(model string) (string, bool) {
	mc := g.conf().Models[model]
	if mc == nil {
		return "", false
	}
	rev, err := cache.Revision(g.cache.models, mc)
	if err != nil {
		g.log.Debug("model revision: the cache is not used for it", "model", model, "err", err)
		return "", false
	}
	c := g.cache
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
				g.log.Info("model revision changed: its older entries purged", "model", model, "purged", n, "err", err)
			}()
		}
	}
	return rev, true
}

// cacheLookup looks p up for owner (p resolved, pools its candidates): a hit's stored
// reply (msgpack, id cleared), or a ticket to store its answer with (nil: p goes without
// the cache). Entries written before since are not taken. A request whose key another
// request is computing waits for that answer (ctx bounds the wait).
func (g *Gateway) cacheLookup(ctx context.Context, p *pending, pools []string, owner string, since time.Time) (*cacheTicket, []byte) {
	s := g.cache.storeOf()
	model := g.cacheModel(p, pools)
	if s == nil || model == "" {
		return nil, nil
	}
	rev, ok := g.revision(model)
	if !ok {
		s.Miss()
		return nil, nil
	}
	t := g.cacheKey(p, model, rev, owner)
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
		fl, leader := g.cache.flights.Join(digest)
		if leader {
			t.flight = fl
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

// cacheKey hashes p's file (the stat key first) and returns p's key for owner on model's
// revision rev; nil when the file cannot be hashed (the worker answers its error).
func (g *Gateway) cacheKey(p *pending, model, rev, owner string) *cacheTicket {
	cfg := g.conf()
	policy := images.Policy{AllowedRoots: cfg.Security.AllowedRoots, MaxBytes: int64(cfg.Security.MaxImageBytes)}
	f, resolved, err := policy.OpenFile(p.req.Path)
	if err != nil {
		return nil
	}
	fs, err := g.cache.files.SumFile(f, resolved, policy.MaxFileBytes())
	f.Close()
	if err != nil {
		return nil
	}
	return &cacheTicket{file: fs, key: cache.Key{Owner: owner, Op: p.op, Model: model, Revision: rev, Options: cache.OptionsOf(p.op, &p.req), Content: fs.Sum}}
}

// cacheDone ends t's flight with p's answer (msgpack; ok: a result) and stores a result,
// if its file and its model are still what t hashed and the worker that computed it
// loaded that revision (its heartbeat says which). It blocks on JetStream (cacheIOBound).
func (g *Gateway) cacheDone(t *cacheTicket, op string, body []byte, ok bool) {
	var stored []byte
	if ok {
		var served codec.Served
		stored, served = cacheBody(op, body)
		switch {
		case stored == nil:
		case served.Model != t.key.Model:
			stored = nil // another model answered (the worker's first ready one): not the key's
		case !g.computedOn(served, t.key.Revision):
			stored = nil // another revision answered
		case !g.cache.files.Unchanged(t.file):
			stored = nil // the file changed while it ran: the answer is not the hashed bytes'
		default:
			if rev, ok := g.revision(t.key.Model); !ok || rev != t.key.Revision {
				stored = nil // the model changed while it ran: which revision answered is unknown
			}
		}
	}
	// What is not stored is not shared either: the requests waiting on the key run.
	if t.flight != nil {
		// Once stored: a request of the key that comes meanwhile waits for this answer
		// rather than find neither the flight nor the entry.
		defer g.cache.flights.Finish(t.key.Digest(), t.flight, stored)
	}
	s := g.cache.storeOf()
	if stored == nil || s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cacheIOBound)
	defer cancel()
	if err := s.Put(ctx, t.key, stored); err != nil {
		g.log.Debug("store an answer in the cache", "err", err)
	}
}

// computedOn reports whether the worker that answered (served) had loaded revision rev
// of its model, as its last heartbeat says: false when it says another one (its files
// were replaced and it was not reloaded yet, or it loaded an older version); true when it
// says none (it could not hash them, or it is gone: then the files, hashed again before
// the store, decide).
func (g *Gateway) computedOn(served codec.Served, rev string) bool {
	for _, w := range g.tracker.Workers() {
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

// cacheFront runs a client's request through the cache before it enters the lifecycle,
// in a goroutine of its own (a lookup reads the file and JetStream), and reports whether
// it took the request; false: submit it as usual. p is decoded, validated, its id set.
func (g *Gateway) cacheFront(p *pending) bool {
	if !g.cacheWanted(p) {
		return false
	}
	select {
	case g.cache.lookups <- struct{}{}:
	default:
		return false // lookups are at their bound: this one goes without
	}
	go func() {
		defer func() { <-g.cache.lookups }()
		defer guard.Recover(g.log, "cache lookup", func(e *codec.Error) {
			if !p.answered.Load() {
				g.deliver(p, "", nil, e)
			}
		})
		pools, e := g.resolve(p)
		if e != nil {
			g.submit(p) // answers the error
			return
		}
		ctx, cancel := context.WithDeadline(context.Background(), p.deadline)
		t, hit := g.cacheLookup(ctx, p, pools, p.tenant, time.Time{})
		cancel()
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
					g.post(evAccept{p: p})
					return
				}
			}
		}
		if t != nil {
			p.cacheTicket = t
			reply := p.reply
			p.reply = func(body []byte, e *codec.Error) {
				reply(body, e)
				g.cacheAfter(p, t, body, e == nil)
			}
		}
		g.submit(p)
	}()
	return true
}

// cacheAfter stores an interactive request's answer (body as its client got it), off
// the sender's goroutine, within cachePutsAtOnce; past the bound only its flight ends.
func (g *Gateway) cacheAfter(p *pending, t *cacheTicket, body []byte, ok bool) {
	if ok && p.asJSON {
		rep := codec.NewReply(p.op)
		if codec.Decode(body, rep, true) != nil {
			ok = false
		} else if body, _ = codec.Marshal(rep); body == nil {
			ok = false
		}
	}
	select {
	case g.cache.puts <- struct{}{}:
		go func() {
			defer func() { <-g.cache.puts }()
			g.cacheDone(t, p.op, body, ok)
		}()
	default:
		g.cacheDone(t, p.op, nil, false)
	}
}

// serveCache answers cache.stats and cache.purge for tenant, who reaches only its own
// entries (the local owner "" every owner's).
func (g *Gateway) serveCache(op string, data []byte, asJSON bool, tenant string, reply Reply) {
	var req codec.CacheRequest
	if len(data) > 0 {
		if e := decodeChecked(data, &req, asJSON, req.Validate); e != nil {
			reply(nil, e)
			return
		}
	}
	if req.Model != "" {
		if _, ok := g.conf().Models[req.Model]; !ok {
			reply(nil, codec.Errorf(codec.CodeUnknownModel, "model %q is not configured", req.Model).With("model", req.Model))
			return
		}
	}
	s := g.cache.storeOf()
	if s == nil {
		b, _ := codec.Encode(&codec.CacheStats{}, asJSON)
		reply(b, nil) // no cache here: enabled false
		return
	}
	select {
	case g.cache.ops <- struct{}{}:
	default:
		reply(nil, codec.Errorf(codec.CodeOverloaded, "%d cache requests are being answered; try again", cacheOpsAtOnce))
		return
	}
	go func() {
		defer func() { <-g.cache.ops }()
		defer guard.Recover(g.log, "cache "+op, func(e *codec.Error) { reply(nil, e) })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st := &codec.CacheStats{}
		if op == subjects.OpCachePurge {
			n, err := s.Purge(ctx, cache.Filter(req.Model, tenant, tenant == ""))
			if err != nil {
				reply(nil, codec.Errorf(codec.CodeUnavailable, "purge the cache: %v", err))
				return
			}
			st.Purged = n
		}
		if e := g.cacheStats(ctx, s, st, req.Model, tenant); e != nil {
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

// cacheStats fills st: the bucket's figures (for tenant, and model when named: a count
// of their entries only) and this gateway's counters.
func (g *Gateway) cacheStats(ctx context.Context, s *cache.Store, st *codec.CacheStats, model, tenant string) *codec.Error {
	st.Enabled, st.MaxBytes = true, s.MaxBytes()
	var err error
	if tenant == "" && model == "" {
		st.Entries, st.Bytes, err = s.Usage(ctx)
	} else {
		st.Entries, err = s.Count(ctx, cache.Filter(model, tenant, tenant == ""))
	}
	if err != nil {
		return codec.Errorf(codec.CodeUnavailable, "read the cache: %v", err)
	}
	c, h := s.Counters(), g.cache.files.Stats()
	st.Hits, st.Misses, st.Corrupt, st.Writes, st.Evictions = c.Hits, c.Misses, c.Corrupt, c.Writes, c.Evictions
	st.Stats, st.Hashed, st.HashBytes = h.Stats, h.Hashed, h.HashBytes
	st.StatMS, st.HashMS = float64(h.StatNS)/1e6, float64(h.HashNS)/1e6
	return nil
}

// cacheCollector reports the cache's figures on /metrics.
type cacheCollector struct{ g *Gateway }

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
	s := c.g.cache.storeOf()
	if s == nil {
		return
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	k, h := s.Counters(), c.g.cache.files.Stats()
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
