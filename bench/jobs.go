package bench

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/jobs"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
)

// Jobs bench settings.
const (
	// JobsItems is the default job size (items; -n).
	JobsItems = 10_000
	// JobsKills is the default number of kills of the whole stack during the kill run.
	JobsKills = 2
	// JobsAckWait is the [jobs] ack_wait of the bench's gateway: items a killed gateway held
	// come back this long after their last word from it.
	JobsAckWait = 2 * time.Second
	// jobsModel is the generated tagger (no compute layers) as the config names it.
	jobsModel = "tagger"
)

// JobsResults are the results of `bench jobs`: the same N tag items through the gateway
// three ways, in one run on one system: as plain batch-class requests (InFlight kept
// outstanding), as one job, and as one job while the whole stack (the gateway's process
// group: gateway, embedded NATS server with its JetStream store, workers) is killed with
// SIGKILL and restarted on the same config, Kills times.
type JobsResults struct {
	Items    int       `json:"items"`
	Plain    JobsPlain `json:"plain"`
	Job      *JobsRun  `json:"job"`
	JobKills *JobsRun  `json:"job_kills"`
	// JobOverPlain and JobKillsOverPlain are the runs' items/s over the plain path's.
	JobOverPlain      float64   `json:"job_over_plain"`
	JobKillsOverPlain float64   `json:"job_kills_over_plain"`
	Setup             JobsSetup `json:"setup"`
}

// JobsPlain is the plain path: one batch-class tag request per item, InFlight outstanding.
type JobsPlain struct {
	ItemsPerS float64 `json:"items_per_s"`
	// ElapsedS is the time from the first request sent to the last reply.
	ElapsedS float64        `json:"elapsed_s"`
	OK       int            `json:"ok"`
	Errors   map[string]int `json:"errors,omitempty"`
	Worker   JobsWorker     `json:"worker"`
}

// JobsWorker is what the items' reply timings say of the worker: ServiceMSMean is the mean
// of total_us - queue_us (the worker's time on an item from when its slot took it: decode,
// preprocessing, the runtime call, the reply), Busy the sum of those over the elapsed time
// (1 = the worker never waited for an item).
type JobsWorker struct {
	ServiceMSMean float64 `json:"service_ms_mean"`
	Busy          float64 `json:"busy"`
}

// serviceSum sums the service times of replies.
type serviceSum struct {
	n   int
	sum time.Duration
}

func (s *serviceSum) add(t codec.Timing) {
	s.n++
	s.sum += time.Duration(max(0, t.TotalUS-t.QueueUS)) * time.Microsecond
}

func (s *serviceSum) over(elapsed time.Duration) JobsWorker {
	if s.n == 0 || elapsed <= 0 {
		return JobsWorker{}
	}
	return JobsWorker{ServiceMSMean: ms(s.sum / time.Duration(s.n)), Busy: round(s.sum.Seconds()/elapsed.Seconds(), 3)}
}

// JobsRun is one job of Items items.
type JobsRun struct {
	Job string `json:"job"`
	// ItemsPerS is Items over ElapsedS: from the submit's start to the last result
	// recorded (the job's finished_unix_ms), restarts included.
	ItemsPerS float64 `json:"items_per_s"`
	ElapsedS  float64 `json:"elapsed_s"`
	// SubmitMS is how long job.submit took to answer (its items all published).
	SubmitMS float64 `json:"submit_ms"`
	// State, Done, Failed and Redelivered are the job's final status (redelivered: items
	// whose result says they were delivered more than once).
	State       string `json:"state"`
	Done        int    `json:"done"`
	Failed      int    `json:"failed"`
	Redelivered int    `json:"redelivered"`
	// RunTwice counts the items whose second run mark exists
	// (ortbus.job.run.<job>.<n>.2 in ORTBUS_JOB_RESULTS): sent to a worker a second time.
	RunTwice int `json:"run_twice"`
	// Results are the results read back (job.results, every page); Distinct the items
	// they cover; Duplicates the results past the first of an item; WrongPath results
	// whose path is not the item's; ResultErrors the results that are errors, by code.
	Results      int            `json:"results"`
	Distinct     int            `json:"distinct_items"`
	Duplicates   int            `json:"duplicates"`
	WrongPath    int            `json:"wrong_path"`
	ResultErrors map[string]int `json:"result_errors,omitempty"`
	// ExactlyOnce: one result per item, every one of them the op's reply for its path.
	ExactlyOnce bool       `json:"exactly_once"`
	Worker      JobsWorker `json:"worker"`
	Kills       []JobsKill `json:"kills,omitempty"`
}

// JobsKill is one kill -9 of the whole stack during a job, and its restart.
type JobsKill struct {
	// Target is the count of results that triggers the kill; AtResults what the bench had
	// seen recorded when it sent SIGKILL (results are watched on their subjects).
	Target    int `json:"target"`
	AtResults int `json:"at_results"`
	PID       int `json:"gateway_pid"`
	// From the restart's start (the killed group reaped, the gateway started again at
	// once): the gateway's ready line and the bench connected (ConnectedMS), every worker
	// live (LiveMS), the first new result recorded (ResumeMS).
	ConnectedMS float64 `json:"connected_ms"`
	LiveMS      float64 `json:"workers_live_ms"`
	ResumeMS    float64 `json:"resume_ms"`
}

// JobsSetup is how the bench ran.
type JobsSetup struct {
	Model    string  `json:"model"`
	Image    string  `json:"image"`
	Workers  int     `json:"workers"`
	Threads  int     `json:"threads"`
	InFlight int     `json:"plain_in_flight"`
	AckWaitS float64 `json:"ack_wait_s"`
	// JobRoom is how many items the gateway holds at once (twice its batch pools' slots).
	JobRoom int       `json:"job_room"`
	Kills   int       `json:"kills"`
	KillAt  []float64 `json:"kill_at_fraction"`
	Warmup  int       `json:"plain_warmup_requests"`
}

// Jobs measures the job path against plain batch requests, with and without kills of the
// whole stack.
func Jobs(ctx context.Context, o Options) (*Report, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	n := positiveOr(o.N, JobsItems)
	inflight := positiveOr(o.InFlight, 32)
	kills := o.Kills
	if kills == 0 {
		kills = JobsKills
	}
	kills = max(kills, 0)
	h, err := newHarness(&o, "jobs", 0)
	if err != nil {
		return nil, err
	}
	defer h.close()
	rep, w := h.rep, h.w

	// The items: solid images of the eight colours, item i is colour i mod 8.
	imgs, paths, err := jobsItems(w, n)
	if err != nil {
		return nil, err
	}
	cfg, err := w.writeConfig(&o, "jobs", jobsConfig(h, inflight))
	if err != nil {
		return nil, err
	}
	res := &JobsResults{Items: n, Setup: JobsSetup{
		Model: "onnxgen tagger (no compute layers)", Image: fmt.Sprintf("%dx%d solid PNG, 8 colours", onnxgen.TaggerSize, onnxgen.TaggerSize),
		Workers: 1, Threads: 1, InFlight: inflight, AckWaitS: JobsAckWait.Seconds(), JobRoom: 2, Kills: kills, Warmup: 2 * inflight}}
	for k := 1; k <= kills; k++ {
		res.Setup.KillAt = append(res.Setup.KillAt, round(float64(k)/float64(kills+1), 3))
	}
	rep.Results = res

	r := &jobsRunner{o: &o, w: w, cfg: cfg, n: n, paths: paths}
	defer func() { r.sys.stop() }()
	if err := r.start(ctx, "jobs", nil); err != nil {
		return nil, err
	}
	r.sys.runtimes(ctx, &rep.Machine.Runtimes)

	// 1. Plain batch requests (after a warm-up that is not counted).
	if _, err := r.plain(ctx, imgs, 2*inflight, inflight); err != nil {
		return nil, fmt.Errorf("plain warm-up: %w", err)
	}
	if res.Plain, err = r.plain(ctx, paths, len(paths), inflight); err != nil {
		return nil, fmt.Errorf("plain requests: %w", err)
	}
	// 2. The job, undisturbed.
	if res.Job, err = r.job(ctx, "bench-nokill", 0); err != nil {
		return nil, fmt.Errorf("job: %w", err)
	}
	// 3. The job while the stack is killed.
	if res.JobKills, err = r.job(ctx, "bench-kills", kills); err != nil {
		return nil, fmt.Errorf("job with kills: %w", err)
	}
	res.JobOverPlain = ratio(res.Job.ItemsPerS, res.Plain.ItemsPerS)
	res.JobKillsOverPlain = ratio(res.JobKills.ItemsPerS, res.Plain.ItemsPerS)

	reportJobs(o.out(), rep, res, n, kills, inflight)
	return rep, nil
}

// jobsItems are the bench's images, solid ones of the eight colours, and its n items'
// paths: item i is colour i mod 8.
func jobsItems(w *workdir, n int) (imgs, paths []string, err error) {
	for _, c := range onnxgen.Colours {
		p, err := w.solidPNG(c.Name, onnxgen.TaggerSize, color.RGBA{R: c.RGB[0], G: c.RGB[1], B: c.RGB[2], A: 255})
		if err != nil {
			return nil, nil, err
		}
		imgs = append(imgs, p)
	}
	paths = make([]string, n)
	for i := range paths {
		paths[i] = imgs[i%len(imgs)]
	}
	return imgs, paths, nil
}

// jobsConfig is the jobs bench's system: one batch pool of one worker, the tagger, the
// bench's ack wait.
func jobsConfig(h *harness, inflight int) sysConfig {
	w := h.w
	const pool = "bulk"
	return sysConfig{
		Images:   w.images,
		StoreDir: filepath.Join(w.dir, "jetstream"),
		Jobs:     config.Jobs{AckWait: config.Duration(JobsAckWait)},
		Pools: []poolSpec{{Name: pool, Runtime: h.lib, Workers: 1, Slots: 1, Threads: 1,
			Classes: []string{subjects.ClassBatch}, Models: []string{jobsModel}}},
		Classes: []classSpec{{Name: subjects.ClassBatch, Chain: []string{pool}, Timeout: 10 * time.Minute, QueueBound: max(10_000, 2*inflight)}},
		Models:  []modelSpec{{Name: jobsModel, Kind: config.KindTaggerPixAI, Dir: filepath.Join(w.models, onnxgen.TaggerDir)}},
	}
}

// reportJobs prints the paths' throughput, the kills and the verdicts, and records the
// targets and what went wrong.
func reportJobs(out io.Writer, rep *Report, res *JobsResults, n, kills, inflight int) {
	fmt.Fprintf(out, "jobs: %d items, %s, 1 worker x 1 thread (ORT %s); plain: %d batch requests in flight; jobs: ack_wait %v, the gateway holds %d items\n",
		n, res.Setup.Model, RuntimeVersion, inflight, JobsAckWait, res.Setup.JobRoom)
	rows := []string{fmt.Sprintf("plain batch requests\t%.2f\t%.2f\t\t\t\t\t%d\t%s\t\t%.2f\t%.3f\t", res.Plain.ItemsPerS, res.Plain.ElapsedS, res.Plain.OK, counts(res.Plain.Errors),
		res.Plain.Worker.ServiceMSMean, res.Plain.Worker.Busy)}
	for _, j := range []struct {
		name string
		r    *JobsRun
		rat  float64
	}{{"job", res.Job, res.JobOverPlain}, {fmt.Sprintf("job, %d kill%s", kills, plural(kills)), res.JobKills, res.JobKillsOverPlain}} {
		rows = append(rows, fmt.Sprintf("%s\t%.2f\t%.2f\t%.1f\t%.3f\t%d\t%d\t%d\t%s\t%v\t%.2f\t%.3f\t", j.name, j.r.ItemsPerS, j.r.ElapsedS, j.r.SubmitMS, j.rat,
			j.r.Redelivered, j.r.RunTwice, j.r.Results, counts(j.r.ResultErrors), j.r.ExactlyOnce, j.r.Worker.ServiceMSMean, j.r.Worker.Busy))
	}
	printTable(out, "path\titems/s\telapsed s\tsubmit ms\tover plain\tredelivered\trun twice\tresults\terrors\texactly once\tworker ms/item\tworker busy\t", rows...)
	if len(res.JobKills.Kills) > 0 {
		var krows []string
		for i, k := range res.JobKills.Kills {
			krows = append(krows, fmt.Sprintf("%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t", i+1, k.Target, k.AtResults, k.ConnectedMS, k.LiveMS, k.ResumeMS))
		}
		printTable(out, "kill\ttarget\tat results\tconnected ms\tworkers live ms\tresume ms\t", krows...)
	}
	okJob, okKills := res.JobOverPlain >= 0.9, res.JobKillsOverPlain >= 0.9
	fmt.Fprintf(out, "job >= 0.9x plain: %s; job with %d kill%s >= 0.9x plain: %s; exactly one result per item: %s, %s\n",
		verdict(okJob), kills, plural(kills), verdict(okKills), verdict(res.Job.ExactlyOnce), verdict(res.JobKills.ExactlyOnce))
	rep.target(okJob, "the job path is %.3fx plain batch requests (target >= 0.9x)", res.JobOverPlain)
	rep.target(okKills, "the job path with %d kill(s) of the stack is %.3fx plain batch requests (target >= 0.9x)", kills, res.JobKillsOverPlain)
	for _, j := range []*JobsRun{res.Job, res.JobKills} {
		if !j.ExactlyOnce {
			rep.note("job %s: not exactly one result per item: %d results for %d of %d items, %d duplicates, %d with the wrong path, errors %v",
				j.Job, j.Results, j.Distinct, n, j.Duplicates, j.WrongPath, j.ResultErrors)
		}
	}
	if res.Plain.OK != n {
		rep.note("plain path: %d of %d requests answered with a result (errors %v)", res.Plain.OK, n, res.Plain.Errors)
	}
}

// jobsRunner holds the system of the jobs bench, which the kill run replaces.
type jobsRunner struct {
	o      *Options
	w      *workdir
	cfg    string
	n      int
	paths  []string
	sys    *system
	starts int
}

// start starts the system on the config (again, after a kill: same config, same store),
// calling connected as soon as the bench is connected.
func (r *jobsRunner) start(ctx context.Context, name string, connected func(*nats.Conn) error) error {
	if r.starts > 0 {
		name = fmt.Sprintf("%s-restart%d", name, r.starts)
	}
	r.starts++
	sys, err := startSystemThen(ctx, r.o, r.w, name, r.cfg, connected)
	if err != nil {
		return err
	}
	r.sys = sys
	return nil
}

// plain sends count batch-class tag requests, item i on paths[i mod len], keeping
// inflight outstanding, and times them from the first sent to the last answered.
func (r *jobsRunner) plain(ctx context.Context, paths []string, count, inflight int) (JobsPlain, error) {
	var next atomic.Int64
	var mu sync.Mutex
	res := JobsPlain{Errors: map[string]int{}}
	var wg sync.WaitGroup
	t0 := time.Now()
	var last time.Time
	var svc serviceSum
	for range min(inflight, count) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= count {
					return
				}
				req := codec.Request{ID: nuid.Next(), Model: jobsModel, Class: subjects.ClassBatch, Path: paths[i%len(paths)], TimeoutMS: 600_000}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
				rep, err := r.sys.cl.Tag(rctx, req)
				cancel()
				now := time.Now()
				mu.Lock()
				if err != nil {
					res.Errors[errCode(err)]++
				} else {
					res.OK++
					svc.add(rep.Timing)
				}
				if now.After(last) {
					last = now
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if len(res.Errors) == 0 {
		res.Errors = nil
	}
	el := last.Sub(t0)
	res.ElapsedS = round(el.Seconds(), 3)
	res.ItemsPerS = perSecond(res.OK, el)
	res.Worker = svc.over(el)
	return res, nil
}

// resultWatch follows a job's results as they are recorded, on their subjects (a core
// subscription sees each result the gateway publishes to the stream).
type resultWatch struct {
	mu   sync.Mutex
	seen []bool
	n    int
	// firstNew is when the first result for a new item arrived since mark.
	marked   bool
	firstNew time.Time
	sub      *nats.Subscription
}

func (rw *resultWatch) subscribe(nc *nats.Conn, job string) error {
	sub, err := nc.Subscribe(subjects.JobResults(job), func(m *nats.Msg) {
		now := time.Now()
		i := -1
		if k := strings.LastIndexByte(m.Subject, '.'); k >= 0 {
			i, _ = strconv.Atoi(m.Subject[k+1:])
		}
		rw.mu.Lock()
		defer rw.mu.Unlock()
		if i < 0 || i >= len(rw.seen) || rw.seen[i] {
			return
		}
		rw.seen[i] = true
		rw.n++
		if rw.marked && rw.firstNew.IsZero() {
			rw.firstNew = now
		}
	})
	if err != nil {
		return err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		sub.Unsubscribe()
		return err
	}
	rw.sub = sub
	return nc.Flush()
}

// count is how many items have been seen with a result.
func (rw *resultWatch) count() int {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.n
}

// mark starts waiting for the first result of an item not seen yet.
func (rw *resultWatch) mark() {
	rw.mu.Lock()
	rw.marked, rw.firstNew = true, time.Time{}
	rw.mu.Unlock()
}

func (rw *resultWatch) first() time.Time {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.firstNew
}

// jobBound bounds one job (and each wait inside it).
const jobBound = 30 * time.Minute

// job submits the N items as one job, kills the stack kills times while it runs (after
// 1/(kills+1), 2/(kills+1)... of its items have results), waits for it to finish, and
// reads back every result.
func (r *jobsRunner) job(ctx context.Context, id string, kills int) (*JobsRun, error) {
	run := &JobsRun{Job: id, ResultErrors: map[string]int{}}
	watch := &resultWatch{seen: make([]bool, r.n)}
	if err := watch.subscribe(r.sys.nc, id); err != nil {
		return nil, err
	}
	t0, err := r.submit(ctx, id)
	if err != nil {
		return nil, err
	}
	run.SubmitMS = ms(time.Since(t0))
	for k := 1; k <= kills; k++ {
		kill, err := r.killAt(ctx, id, watch, k, r.n*k/(kills+1))
		if err != nil {
			return nil, err
		}
		run.Kills = append(run.Kills, kill)
	}

	// The end: every item seen with a result, then the job's status says done (it is
	// asked every 2 s meanwhile, in case a result's message was not seen).
	st, err := r.await(ctx, id, watch)
	if err != nil {
		return nil, err
	}
	watch.sub.Unsubscribe()
	run.State, run.Done, run.Failed, run.Redelivered = st.State, st.Done, st.Failed, st.Redelivered
	end := time.UnixMilli(st.FinishedUnixMS)
	run.ElapsedS = round(end.Sub(t0).Seconds(), 3)
	run.ItemsPerS = perSecond(r.n, end.Sub(t0))

	ictx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if run.RunTwice, err = r.runTwice(ictx, id); err != nil {
		return nil, err
	}
	if err := r.readResults(ictx, id, run, end.Sub(t0)); err != nil {
		return nil, err
	}
	run.ExactlyOnce = run.Results == r.n && run.Distinct == r.n && run.Duplicates == 0 && run.WrongPath == 0 && len(run.ResultErrors) == 0
	if len(run.ResultErrors) == 0 {
		run.ResultErrors = nil
	}
	return run, nil
}

// submit submits the N items as job id (refused here when the submit is over the bus's
// max_payload), and returns when it was sent: the job's start.
func (r *jobsRunner) submit(ctx context.Context, id string) (time.Time, error) {
	req := &codec.JobSubmit{Job: id, Op: subjects.OpTag, Model: jobsModel, Class: subjects.ClassBatch, Items: r.paths}
	if b, err := codec.Marshal(req); err == nil && int64(len(b)) > r.sys.nc.MaxPayload() {
		return time.Time{}, fmt.Errorf("a submit of %d items is %d bytes, over the bus's max_payload (%d): use a smaller -n", r.n, len(b), r.sys.nc.MaxPayload())
	}
	t0 := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	sub, err := r.sys.cl.SubmitJob(sctx, req)
	cancel()
	if err != nil {
		return t0, fmt.Errorf("submit: %w", err)
	}
	if sub.Total != r.n {
		return t0, fmt.Errorf("submit answered %d items, want %d", sub.Total, r.n)
	}
	return t0, nil
}

// killAt is kill k of job id: once target items have results, the stack is killed and
// restarted, and the job's results followed again until a new one comes.
func (r *jobsRunner) killAt(ctx context.Context, id string, watch *resultWatch, k, target int) (JobsKill, error) {
	kill := JobsKill{Target: target}
	until := time.Now().Add(jobBound)
	for watch.count() < kill.Target {
		if time.Now().After(until) {
			return JobsKill{}, fmt.Errorf("kill %d: %d results within %v, waiting for %d", k, watch.count(), jobBound, kill.Target)
		}
		select {
		case <-ctx.Done():
			return JobsKill{}, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	kill.PID = r.sys.gw.PID()
	r.sys.gw.Kill() // SIGKILL to the gateway's process group, and its exit awaited
	kill.AtResults = watch.count()
	r.sys.stop()
	restart := time.Now()
	watch.mark()
	var connected time.Time
	err := r.start(ctx, "jobs", func(nc *nats.Conn) error {
		connected = time.Now()
		return watch.subscribe(nc, id)
	})
	if err != nil {
		return JobsKill{}, fmt.Errorf("restart %d: %w", k, err)
	}
	kill.ConnectedMS, kill.LiveMS = ms(connected.Sub(restart)), ms(time.Since(restart))
	for watch.first().IsZero() {
		if time.Since(restart) > jobBound {
			return JobsKill{}, fmt.Errorf("restart %d: no new result within %v", k, jobBound)
		}
		select {
		case <-ctx.Done():
			return JobsKill{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	kill.ResumeMS = ms(watch.first().Sub(restart))
	return kill, nil
}

// runTwice counts job id's items run twice: their second run mark.
func (r *jobsRunner) runTwice(ctx context.Context, id string) (int, error) {
	js, err := jetstream.New(r.sys.nc)
	if err != nil {
		return 0, err
	}
	stream, err := js.Stream(ctx, jobs.ResultsStream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", jobs.ResultsStream, err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subjects.JobRunPrefix+"."+id+".*.2"))
	if err != nil {
		return 0, fmt.Errorf("run marks: %w", err)
	}
	return len(info.State.Subjects), nil
}

// readResults reads every result of job id back through the gateway into run: counts,
// duplicates, wrong paths, errors, and the worker's service over the job's elapsed time.
func (r *jobsRunner) readResults(ctx context.Context, id string, run *JobsRun, elapsed time.Duration) error {
	per := make([]int, r.n)
	var svc serviceSum
	err := r.sys.cl.EachJobResult(ctx, id, func(jr *codec.JobResult) error {
		run.Results++
		if jr.Index < 0 || jr.Index >= r.n {
			run.WrongPath++
			return nil
		}
		if per[jr.Index]++; per[jr.Index] > 1 {
			run.Duplicates++
		}
		if jr.Path != r.paths[jr.Index] {
			run.WrongPath++
		}
		if jr.Error != nil {
			run.ResultErrors[string(jr.Error.Code)]++
		} else if tr, ok := jr.Result.(*codec.TagReply); !ok {
			run.ResultErrors["not_a_tag_reply"]++
		} else {
			svc.add(tr.Timing)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read results: %w", err)
	}
	run.Worker = svc.over(elapsed)
	for _, c := range per {
		if c > 0 {
			run.Distinct++
		}
	}
	return nil
}

// await waits for the job to finish and returns its final status.
func (r *jobsRunner) await(ctx context.Context, id string, watch *resultWatch) (*codec.JobStatus, error) {
	until := time.Now().Add(jobBound)
	asked := time.Now()
	for {
		gap := 2 * time.Second
		if watch.count() >= r.n {
			gap = 50 * time.Millisecond
		}
		if time.Since(asked) >= gap {
			asked = time.Now()
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			st, err := r.sys.cl.JobStatus(sctx, id)
			cancel()
			if err == nil && st.Finished() {
				return st, nil
			}
			if err != nil && ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
		if time.Now().After(until) {
			return nil, fmt.Errorf("job %s not finished within %v (%d results seen)", id, jobBound, watch.count())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// counts prints counts by code ("none" when there are none), in code order.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
