package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/cache"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/health"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/jobs"
	"github.com/ortbus/ortbus/subjects"
	"github.com/ortbus/ortbus/telemetry"
)

// The gateway's side of the job API (ortbus.v1.job.*; the store and its rules are in
// package jobs): it opens the store, answers the job ops, and runs the items JetStream
// delivers to it through its own queues, as requests of the job's class. A job item
// meets the same sharing policy, deadlines, retries and memory admission as a client's
// request; what differs is who holds it (JetStream, not the client's connection).

// Limits of the job API.
const (
	// jobOpsAtOnce bounds the job requests being answered at once; past it a job request
	// is answered overloaded at once. Each may wait on JetStream.
	jobOpsAtOnce = 16
	// jobOpTimeout bounds one job request (a submit of many items publishes them all).
	jobOpTimeout = 2 * time.Minute
	// jobOpenRetry is the pause between attempts to open the store while JetStream is
	// not ready yet (a cluster electing its leaders; jsopen.go rule 3).
	jobOpenRetry    = 500 * time.Millisecond
	jobOpenRetryMax = 5 * time.Second
	// jobCancelWait bounds the wait for a cancelled item's answer.
	jobCancelWait = 30 * time.Second
	// jobStopBound bounds the wait at the gateway's stop for the job items it holds.
	jobStopBound = 10 * time.Second
)

// jobService is the gateway's side of the job API: the store once open, and the bound
// on the job requests being answered, are its own.
type jobService struct {
	mu    sync.Mutex
	store *jobs.Store // nil until opened (and for good when JetStream is off)
	why   *codec.Error
	slots chan struct{}
	done  chan struct{} // made by start; closed when the consumer and the watch have stopped

	// What it needs of the rest of the gateway, given at construction (newJobService).
	conf   func() *config.Config
	log    *slog.Logger
	nc     *nats.Conn
	d      dispatchPort                      // runs the items as requests (the dispatcher)
	cache  *cacheService                     // answers items from the result cache
	pauses *pauses                           // batch paused: no new items
	live   func(pool string) []health.Worker // the tracker's live workers of a pool
	// poolInfo is the supervisor's word on a local pool: crash-looping, or failed for
	// good (runtime_missing, ...).
	poolInfo func(pool string) (crashLooping bool, failed *codec.Error)
}

// get returns the store, or the error to answer while there is none.
func (j *jobService) get() (*jobs.Store, *codec.Error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.store == nil {
		return nil, j.why
	}
	return j.store, nil
}

// start opens the job store in the background (retrying while JetStream is not
// ready), then runs this gateway's consumer of job items and its watch of the job
// records until ctx ends. Without JetStream (the embedded server with no store_dir, or a
// server without it) the job API answers unavailable.
func (j *jobService) start(ctx context.Context) {
	j.done = make(chan struct{})
	if cfg := j.conf(); cfg.NATS.Embedded && cfg.NATS.StoreDir == "" {
		j.why = jobs.Unavailable()
		close(j.done)
		return
	}
	go func() {
		defer close(j.done)
		var s *jobs.Store
		opened := defaultJSOpener.open(ctx, j.log, "job store", func(actx context.Context) (err error) {
			s, err = jobs.Open(actx, j.nc, j.conf().Jobs, j.log)
			return err
		}, func(err error) {
			// A cluster answers "no JetStream" until its nodes have elected their meta
			// leader; a server without JetStream may get it later. The API answers
			// unavailable meanwhile, and the gateway keeps trying, less and less often.
			if errors.Is(err, jobs.ErrNoJetStream) {
				j.mu.Lock()
				j.why = jobs.Unavailable()
				j.mu.Unlock()
			}
		})
		if !opened {
			return
		}
		j.mu.Lock()
		j.store = s
		j.mu.Unlock()
		j.log.Info("job store open")
		j.cache.open(ctx, j.nc) // the result cache lives on the same JetStream
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); s.Watch(ctx) }()
		go func() { defer wg.Done(); s.Consume(ctx, jobHost{j, s}) }()
		wg.Wait()
	}()
}

// newJobService is the job service, its store not open yet (start): its items run as
// requests through d, answered from cache when they can be, held by the pauses, on the
// tracker's live workers (live); poolInfo tells why a local pool has none (explainWaiting).
func newJobService(conf func() *config.Config, log *slog.Logger, nc *nats.Conn, d dispatchPort, cache *cacheService, ps *pauses,
	live func(pool string) []health.Worker, poolInfo func(pool string) (bool, *codec.Error)) *jobService {
	return &jobService{slots: make(chan struct{}, jobOpsAtOnce), why: codec.Errorf(codec.CodeUnavailable, "the job store is not open yet"),
		conf: conf, log: log, nc: nc, d: d, cache: cache, pauses: ps, live: live, poolInfo: poolInfo}
}

// jobHost is the job service as the jobs.Host of its consumer of s's items: room and
// runItem.
type jobHost struct {
	j *jobService
	s *jobs.Store
}

func (h jobHost) Room() int { return h.j.room(h.s) }
func (h jobHost) RunItem(ctx context.Context, it jobs.Item) ([]byte, *codec.Error) {
	return h.j.runItem(ctx, it)
}

// room is how many job items this gateway takes at once: twice what the live workers
// of the pools that serve the batch class run at once (slots × max_batch each), so that
// the next items are queued here when a slot frees, and none while no worker lives, nor
// on a device where batch is paused, nor outside the jobs' windows ([jobs] windows)
// unless s knows of an anytime job (jobs rule 9: the others' items are parked). JetStream's
// max_ack_pending bounds the total over all gateways.
func (j *jobService) room(s *jobs.Store) int {
	n := 0
	cfg := j.conf()
	now := pauseNow()
	if !cfg.Jobs.InWindow(now) && !s.AnytimeKnown() {
		return 0 // outside the quiet hours ([jobs] windows): the items wait in JetStream
	}
	paused := j.pauses.active(now)[subjects.ClassBatch]
	for _, name := range cfg.PoolNames() {
		pc := cfg.Pools[name]
		if !contains(pc.Classes, subjects.ClassBatch) || paused[""] || paused[pc.Device] {
			continue // batch paused there: no new items (pause.go, rule 2)
		}
		n += len(j.live(name)) * max(1, pc.Slots) * max(1, pc.MaxBatch)
	}
	return 2 * n
}

// runItem runs one job item (jobHost's Run): it answers it from the result cache
// when it may (jobCacheLookup), else runs it as a request of its job's class through
// this gateway's queues (runJobRequest), and returns the op's reply (msgpack) or error.
func (j *jobService) runItem(ctx context.Context, it jobs.Item) ([]byte, *codec.Error) {
	rec := it.Job
	// jobOwner: the job's account, whose own pauses hold its items (pause.go).
	p := &pending{op: rec.Op, accepted: time.Now(), owner: ownerJob, jobOwner: rec.Owner}
	if o := rec.Options; o != nil {
		p.req = jobOptions(o) // what a job's options may set, whoever wrote the record
	}
	p.req.ID, p.req.Path, p.req.Model, p.req.Class, p.req.Pool = it.ID(), it.Path, rec.Model, rec.Class, rec.Pool
	p.size = int64(len(it.Path) + len(p.req.ID) + 64)
	traceStart(ctx, p, telemetry.AttrJob.String(rec.Job))
	ticket, hit := j.cacheLookup(ctx, p, rec)
	if hit != nil {
		it.FromCache()
		traceEnd(p, "", "")
		return hit, nil
	}
	body, e := j.runRequest(ctx, p)
	if ticket != nil {
		j.cache.done(ticket, p.op, body, e == nil)
	}
	return body, e
}

// cacheLookup looks a job item up in the result cache (cache.go): an incremental job
// takes any entry of its key, another job only those written since it was created (a
// duplicate of an earlier item of its own). A hit is the reply to answer (msgpack, the
// item's id, timing.cached); else the ticket to store the answer with (nil: no cache).
func (j *jobService) cacheLookup(ctx context.Context, p *pending, rec *jobs.Record) (*cacheTicket, []byte) {
	if !j.cache.wanted(p) {
		return nil, nil
	}
	pools, e := resolve(j.conf(), p)
	if e != nil {
		return nil, nil // submit answers the error
	}
	since := time.UnixMilli(rec.Created)
	if rec.Incremental {
		since = time.Time{}
	}
	start := time.Now()
	t, hit := j.cache.lookup(ctx, p, pools, rec.Owner, since)
	traceLookup(p, start, hit != nil)
	if hit == nil {
		return t, nil
	}
	if rep := cachedReply(p.op, hit, p.req.ID, p.accepted); rep != nil {
		if b, err := codec.Marshal(rep); err == nil {
			return nil, b
		}
	}
	return nil, nil
}

// precomputed answers an incremental job's items from the result cache at its submit
// (jobs.SubmitWith): an item whose answer the cache holds is recorded as its result at
// once and never queued, so an unchanged library costs a stat and a cache read per
// item; the rest run as usual (and their duplicates meet in runJobItem's flights). nil
// where the job may not use the cache.
func (j *jobService) precomputed(rec *jobs.Record) jobs.Precomputed {
	probe := &pending{op: rec.Op, accepted: time.Now(), owner: ownerJob, jobOwner: rec.Owner}
	if rec.Options != nil {
		probe.req = jobOptions(rec.Options)
	}
	probe.req.Path, probe.req.Model, probe.req.Class, probe.req.Pool = "/", rec.Model, rec.Class, rec.Pool
	if !rec.Incremental || !j.cache.wanted(probe) {
		return nil
	}
	pools, e := resolve(j.conf(), probe)
	if e != nil {
		return nil
	}
	model := j.cache.model(probe, pools)
	if model == "" {
		return nil
	}
	rev, ok := j.cache.revision(model)
	if !ok {
		return nil
	}
	s := j.cache.storeOf()
	return func(ctx context.Context, i int, path string) (answer []byte) {
		defer guard.Recover(j.log, "job cache lookup", func(*codec.Error) { answer = nil })
		start := time.Now()
		p := &pending{op: probe.op, req: probe.req}
		p.req.Path = path // checked by OpenFile (images.Policy), as where it runs
		t := j.cache.key(p, model, rev, rec.Owner)
		if t == nil {
			s.Miss()
			return nil
		}
		gctx, cancel := context.WithTimeout(ctx, cacheIOBound)
		body, ok := s.Get(gctx, t.key, time.Time{})
		cancel()
		if !ok {
			return nil
		}
		rep := cachedReply(p.op, body, jobs.Item{Job: rec, Index: i}.ID(), start)
		if rep == nil {
			return nil
		}
		b, err := codec.Marshal(rep)
		if err != nil {
			return nil
		}
		return b
	}
}

// runRequest runs a job item's request through this gateway's queues and returns the
// op's reply (msgpack) or error: its one answer, whoever gives it. When ctx ends (the job
// is cancelled, the gateway stops) the request is cancelled, bounded: the lifecycle
// answers it cancelled should its worker not confirm within jobCancelWait (L9).
func (j *jobService) runRequest(ctx context.Context, p *pending) ([]byte, *codec.Error) {
	type answer struct {
		body []byte
		err  *codec.Error
	}
	done := make(chan answer, 1)
	p.reply = func(b []byte, e *codec.Error) { done <- answer{b, e} }
	j.d.submit(p)
	select {
	case a := <-done:
		return a.body, a.err
	case <-ctx.Done():
	}
	j.d.post(evCancel{id: p.id, within: jobCancelWait})
	select {
	case a := <-done:
		return a.body, a.err
	case <-j.d.stopped():
		// Stopped: every request it held was answered (L10), this one's answer first
		// unless it never reached the loop.
		select {
		case a := <-done:
			return a.body, a.err
		default:
			return nil, codec.Errorf(codec.CodeCancelled, "cancelled as the gateway stopped")
		}
	}
}

// serve answers one job op of account, who owns the jobs it submits and reaches only
// those (account.go). The work runs in its own goroutine (a submit publishes every item
// and waits for JetStream), at most jobOpsAtOnce at a time.
func (j *jobService) serve(op string, data []byte, asJSON bool, account string, reply Reply) {
	s, e := j.get()
	if e != nil {
		reply(nil, e)
		return
	}
	select {
	case j.slots <- struct{}{}:
	default:
		reply(nil, codec.Errorf(codec.CodeOverloaded, "%d job requests are being answered; try again", jobOpsAtOnce))
		return
	}
	go func() {
		defer func() { <-j.slots }()
		defer guard.Recover(j.log, "job "+op, func(e *codec.Error) { reply(nil, e) })
		ctx, cancel := context.WithTimeout(context.Background(), jobOpTimeout)
		defer cancel()
		v, e := j.op(ctx, s, op, data, asJSON, account)
		if e != nil {
			reply(nil, e)
			return
		}
		b, err := codec.Encode(v, asJSON)
		if err != nil {
			reply(nil, codec.Errorf(codec.CodeInternal, "%v", err))
			return
		}
		reply(b, nil)
	}()
}

// op decodes, checks and runs one job op of account.
func (j *jobService) op(ctx context.Context, s *jobs.Store, op string, data []byte, asJSON bool, account string) (any, *codec.Error) {
	switch op {
	case subjects.OpJobSubmit:
		var req codec.JobSubmit
		if err := decodeChecked(data, &req, asJSON, req.Validate); err != nil {
			return nil, err
		}
		rec, paths, e := j.spec(&req)
		if e != nil {
			return nil, e
		}
		if e := j.incremental(rec); e != nil {
			return nil, e
		}
		// The job is account's, under account's own id (jobs/owner.go: job ids are per
		// owner, as request ids are).
		rec.Owner = account
		if e := j.runningRoom(ctx, s, rec, account); e != nil {
			return nil, e
		}
		return s.SubmitWith(ctx, rec, paths, j.precomputed(rec))
	case subjects.OpJobStatus, subjects.OpJobCancel, subjects.OpJobPause, subjects.OpJobResume:
		var ref codec.JobRef
		if err := decodeChecked(data, &ref, asJSON, func() error { return codec.CheckJobID(ref.Job) }); err != nil {
			return nil, err
		}
		switch op {
		case subjects.OpJobCancel:
			return s.Cancel(ctx, ref.Job, account)
		case subjects.OpJobPause, subjects.OpJobResume:
			return s.Pause(ctx, ref.Job, account, op == subjects.OpJobPause)
		}
		st, e := s.Status(ctx, ref.Job, account)
		j.explainWaiting(st)
		return st, e
	case subjects.OpJobList:
		l, e := s.List(ctx, account)
		if l != nil {
			for i := range l.Jobs {
				j.explainWaiting(&l.Jobs[i])
			}
		}
		return l, e
	case subjects.OpJobResults:
		var req codec.JobResultsRequest
		if err := decodeChecked(data, &req, asJSON, func() error { return codec.CheckJobID(req.Job) }); err != nil {
			return nil, err
		}
		// Results are kept as msgpack; as JSON they take more room (floats as text).
		limit := int(j.nc.MaxPayload()) / 2
		if asJSON {
			limit /= 3
		}
		return s.Results(ctx, &req, account, limit)
	}
	return nil, codec.Errorf(codec.CodeUnknownOp, "unknown op %q", op)
}

// spec turns a checked submit into the job's record and its items: the class
// defaults to batch; the class, model, pool and op must resolve as a request of the job
// would (checked once here, not per item); a directory must lie inside the allowed
// roots (symlinks resolved), and is listed through an os.Root so that nothing outside
// them is listed, however it is swapped meanwhile (jobs.ExpandAllowed). Each item's
// path is checked where it is read, like any request's.
func (j *jobService) spec(req *codec.JobSubmit) (*jobs.Record, []string, *codec.Error) {
	rec := &jobs.Record{Job: req.Job, Op: req.Op, Model: req.Model, Class: req.Class, Pool: req.Pool, Incremental: req.Incremental, Anytime: req.Anytime}
	if rec.Class == "" {
		rec.Class = subjects.ClassBatch
	}
	if o := req.Options; o != nil {
		opts := jobOptions(o)
		rec.Options = &opts
	}
	probe := &pending{op: rec.Op, accepted: time.Now()}
	if rec.Options != nil {
		probe.req = *rec.Options
	}
	probe.req.Model, probe.req.Class, probe.req.Pool = rec.Model, rec.Class, rec.Pool
	c := j.conf() // one configuration for the whole check
	pools, e := resolve(c, probe)
	if e != nil {
		return nil, nil, e
	}
	// The model the class gives the op by default is fixed now, so that every item of
	// the job runs on the same model whatever the config says later.
	rec.Model = probe.req.Model
	policy := images.Policy{AllowedRoots: c.Security.AllowedRoots}
	if req.Dir == nil {
		// Each item is refused here as a request's path would be where it is read
		// (bad_request: not absolute or not clean; forbidden_path: outside the allowed
		// roots as written), so that a job of paths it can never read is refused whole at
		// its submit rather than accepted to fail item by item. What needs the file (its
		// symlinks, its type) is still checked where each item is read. A path outside
		// this gateway's roots that a candidate pool's path_map covers is that pool's
		// host's to check (as a request's path is: mapPaths), so it is not refused here.
		for i, path := range req.Items {
			if err := policy.Admit(path); err != nil && (codec.CodeOf(err) != codec.CodeForbiddenPath || !mappedByAny(c, pools, path)) {
				return nil, nil, codec.AsError(err).With("item", i)
			}
		}
		// What the client's own walk left out (codec checked it: bounded, known reasons)
		// is kept for job.status as it said it; it names no file the job reads.
		rec.Skipped, rec.SkippedTotal = req.Skipped, req.SkippedTotal
		return rec, req.Items, nil
	}
	l, e := jobs.ExpandAllowed(policy, *req.Dir, c.Jobs.MaxItems)
	if e != nil {
		return nil, nil, e
	}
	if len(l.Items) == 0 {
		e := codec.Errorf(codec.CodeBadRequest, "%s holds no images (%d entries left out%s)", req.Dir.Path, l.SkippedTotal, skipHint(l)).With("field", "dir")
		if len(l.Skipped) > 0 {
			e = e.With("skipped", l.Skipped)
		}
		return nil, nil, e
	}
	rec.Skipped, rec.SkippedTotal = l.Skipped, l.SkippedTotal
	return rec, l.Items, nil
}

// explainWaiting sets st.Waiting when a running job has items left and none running,
// and no pool it may use has a live worker: its items are not fetched (capacity counts
// live workers), so the job would wait mute. It says why per pool — the supervisor's
// failure (runtime_missing, ...), crash-looping, or no live worker — with the failure's
// own code for a chain of one, as a plain request's answer would be (route.go, waiting).
func (j *jobService) explainWaiting(st *codec.JobStatus) {
	if st == nil || st.State != codec.JobRunning || st.Running > 0 || st.Done+st.Failed >= st.Total || j.live == nil {
		return
	}
	probe := &pending{op: st.Op}
	probe.req.Model, probe.req.Class, probe.req.Pool = st.Model, st.Class, st.Pool
	pools, e := resolve(j.conf(), probe)
	if e != nil {
		st.Waiting = e // the config changed under the job: its class or pool is gone
		return
	}
	var why []string
	var failed *codec.Error
	for _, pool := range pools {
		if len(j.live(pool)) > 0 {
			return // its items run as soon as the consumer fetches them
		}
		reason := "no live worker"
		if j.poolInfo != nil {
			switch looping, pe := j.poolInfo(pool); {
			case pe != nil:
				reason = fmt.Sprintf("%s: %s", pe.Code, pe.Message)
				if failed == nil {
					failed = pe
				}
			case looping:
				reason = "crash-looping (its workers keep exiting; see ortbus status)"
			}
		}
		why = append(why, pool+": "+reason)
	}
	code := codec.CodeNoWorker
	if failed != nil && len(pools) == 1 {
		code = failed.Code
	}
	st.Waiting = codec.Errorf(code, "no pool of class %s can run the job's items now: %s", st.Class, strings.Join(why, "; ")).
		With("pools", pools).With("reasons", why)
}

// skipHint is what an empty directory's answer adds when its subdirectories were all
// that held anything: the flag that would take them.
func skipHint(l jobs.Listing) string {
	for _, s := range l.Skipped {
		if s.Reason == codec.JobSkipDirectory {
			return "; its subdirectories are listed only with recursive (--recursive)"
		}
	}
	return ""
}

// incremental refuses an incremental job this gateway cannot answer from the result
// cache, rather than accept it and compute every item: the cache off ([cache] enabled =
// false: bad_request, naming the key), an op the cache does not keep (bad_request), or
// the cache not open (unavailable: JetStream not ready yet).
func (j *jobService) incremental(rec *jobs.Record) *codec.Error {
	if !rec.Incremental {
		return nil
	}
	switch {
	case !j.conf().Cache.Enabled:
		return codec.Errorf(codec.CodeBadRequest, "incremental: the result cache is off on this gateway; set [cache] enabled = true in its config").With("field", "incremental")
	case !cache.Cacheable(rec.Op):
		return codec.Errorf(codec.CodeBadRequest, "incremental: the result cache does not keep %s answers (only tag, embed and detect)", rec.Op).With("field", "incremental")
	case rec.Options != nil && rec.Options.Cache != nil && !*rec.Options.Cache:
		return codec.Errorf(codec.CodeBadRequest, "incremental: options say cache: false").With("field", "incremental")
	case j.cache.storeOf() == nil:
		return codec.Errorf(codec.CodeUnavailable, "incremental: the result cache is not open yet ([cache] enabled; JetStream)").With("field", "incremental")
	}
	return nil
}

// stop waits, after ctx of startJobs ended, for the consumer and the watch to stop
// and for the items this gateway held to be settled (their results recorded, or left for
// redelivery), within bound.
func (j *jobService) stop(bound time.Duration) {
	if j.done == nil {
		return // never started
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-j.done:
	case <-t.C:
		return
	}
	s, _ := j.get()
	for s != nil && s.Held() > 0 {
		select {
		case <-t.C:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// jobOptions is the part of a request's fields that a job's options may set
// (codec.JobSubmit.Options): thresholds, conf, iou, timeout_ms, device and cache.
func jobOptions(o *codec.Request) codec.Request {
	return codec.Request{Device: o.Device, TimeoutMS: o.TimeoutMS, Thresholds: o.Thresholds, Conf: o.Conf, IoU: o.IoU, Cache: o.Cache}
}

// runningRoom refuses a new job (overloaded) while jobs.max_running jobs run, or while its
// account other than the local owner runs accountBound of them (account.go, rule 5). A
// re-submit of a job that exists is no new job. Concurrent submits may pass the check
// together: the bound is exceeded by at most jobOpsAtOnce.
func (j *jobService) runningRoom(ctx context.Context, s *jobs.Store, rec *jobs.Record, account string) *codec.Error {
	if rec.Job != "" && s.Owns(ctx, rec.Job, account) {
		return nil
	}
	limit := j.conf().Jobs.MaxRunning
	all, own, e := s.Running(ctx, account, limit)
	if e != nil {
		return e
	}
	if all >= limit {
		return codec.Errorf(codec.CodeOverloaded, "%d jobs are running, jobs.max_running; try again when one is done", all).With("limit", limit)
	}
	if account != "" && own >= accountBound(limit) {
		return codec.Errorf(codec.CodeOverloaded, "you have %d jobs running, this gateway's bound for one owner; try again when one is done", own).With("limit", accountBound(limit))
	}
	return nil
}

// opening returns why the job store is not open while startJobs still tries to open it,
// else nil: open, never tried (no job service; the embedded server without
// nats.store_dir), given up at the gateway's stop, or refused by a server that answered
// it has no JetStream (jobs.Unavailable): where JetStream is off the job API answers
// unavailable by design, which is no reason to hold inference back.
func (j *jobService) opening() *codec.Error {
	if j.done == nil {
		return nil // never started
	}
	select {
	case <-j.done:
		return nil
	default:
	}
	s, why := j.get()
	if s != nil || why == nil {
		return nil
	}
	if off := jobs.Unavailable(); why.Code == off.Code && why.Message == off.Message {
		return nil
	}
	return why
}
