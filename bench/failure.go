package bench

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/subjects"
)

// FailureHeavyLayers is tagger-heavy's compute layer count in the failure bench: ~45 ms a
// request, so a worker always holds one when it is killed.
const FailureHeavyLayers = 10

// FailureResults are the results of `bench failure`: a pool of two workers under load,
// one of them killed with SIGKILL while it holds requests.
type FailureResults struct {
	// AnsweredMS is the time from the kill until every request the killed worker held
	// (by its own stats, taken just before the kill) had its terminal answer.
	AnsweredMS float64 `json:"answered_ms"`
	// Lost is requests sent minus terminal answers received, over the whole run (after
	// the load stopped and every answer had time to come).
	Lost int `json:"lost"`
	// ServingAgainMS is the time from the kill until the first result served by the
	// replacement worker: the pool at full strength again.
	ServingAgainMS float64 `json:"serving_again_ms"`
	// ReplacementLiveMS is the time from the kill until the gateway's status shows the
	// replacement worker live.
	ReplacementLiveMS float64 `json:"replacement_live_ms"`

	Killed    string `json:"killed_worker"`
	KilledPID int    `json:"killed_pid"`
	Replaced  string `json:"replacement_worker"`
	Held      int    `json:"held"`
	// HeldOutcomes are the answers of the held requests by code ("ok" for a result).
	HeldOutcomes map[string]int `json:"held_outcomes"`
	Sent         int            `json:"sent"`
	Answered     int            `json:"answered"`
	// Outcomes are all answers by code ("ok" for a result).
	Outcomes map[string]int `json:"outcomes"`
	Workers  int            `json:"workers"`
	InFlight int            `json:"in_flight"`
	Model    string         `json:"model"`
	LoadS    float64        `json:"load_before_kill_s"`
}

// Failure kills a loaded worker and measures how the system answers what it held and how
// soon the pool serves again.
func Failure(ctx context.Context, o Options) (*Report, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	load := positiveOr(o.Duration, 2*time.Second)
	inflight := positiveOr(o.InFlight, 8)
	h, err := newHarness(&o, "failure", FailureHeavyLayers)
	if err != nil {
		return nil, err
	}
	defer h.close()
	img, err := h.w.solidPNG("blue", 256, color.RGBA{B: 255, A: 255})
	if err != nil {
		return nil, err
	}
	sys, err := h.startSystem(ctx, "failure", failureConfig(h))
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	before, err := readyWorkers(ctx, sys, failurePool)
	if err != nil {
		return nil, err
	}
	f, err := newFailureRun(sys, before)
	if err != nil {
		return nil, err
	}
	defer f.cl.close()

	// Load, then the kill of a worker holding requests, then the wait for its replacement.
	f.load = newAsyncLoad(inflight)
	f.watchReplies()
	f.load.run(ctx, func() error {
		req := codec.Request{ID: nuid.Next(), Model: "heavy", Class: subjects.ClassInteractive, Path: img, TimeoutMS: 60_000}
		_, err := f.cl.send(subjects.OpTag, &req)
		return err
	})
	defer f.load.halt()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(load):
	}
	victim := before[0]
	held, kill, err := f.killHolding(victim)
	if err != nil {
		return nil, err
	}
	res := &FailureResults{Killed: victim.id, KilledPID: victim.pid, Held: len(held), HeldOutcomes: map[string]int{}, Outcomes: map[string]int{},
		Workers: 2, InFlight: inflight, Model: fmt.Sprintf("onnxgen tagger-heavy, %d compute layers", FailureHeavyLayers), LoadS: load.Seconds()}
	h.rep.Results = res
	if err := f.awaitReplacement(ctx, kill, res, h.rep); err != nil {
		return nil, err
	}
	if err := f.load.halt(); err != nil {
		return nil, err
	}

	// Every answer in (or its time out), then the tally.
	f.cl.wait(ctx, 60*time.Second)
	res.tally(f.cl.snapshot(), held, kill)
	res.print(o.out(), h.rep, load)
	return h.rep, nil
}

// failurePool is the failure bench's one pool.
const failurePool = "w"

// failureConfig is a pool of two single-slot workers of the heavy tagger.
func failureConfig(h *harness) sysConfig {
	return sysConfig{
		Images: h.w.images,
		Pools: []poolSpec{{Name: failurePool, Runtime: h.lib, Workers: 2, Slots: 1, Threads: 1,
			Classes: []string{subjects.ClassInteractive}, Models: []string{"heavy"}}},
		Classes: []classSpec{{Name: subjects.ClassInteractive, Chain: []string{failurePool}, Timeout: time.Minute, MaxTimeout: time.Minute}},
		Models:  []modelSpec{{Name: "heavy", Kind: config.KindTaggerPixAI, Dir: filepath.Join(h.w.models, onnxgen.TaggerHeavyDir)}},
	}
}

// procWorker is a worker by its id and process id.
type procWorker struct {
	id  string
	pid int
}

// readyWorkers are the pool's ready workers by id, of which there must be two, with pids.
func readyWorkers(ctx context.Context, sys *system, pool string) ([]procWorker, error) {
	st, err := sys.status(ctx)
	if err != nil {
		return nil, err
	}
	var before []procWorker
	for _, x := range st.Workers {
		if x.Pool == pool && x.State == codec.StateReady {
			before = append(before, procWorker{x.Worker, x.PID})
		}
	}
	sort.Slice(before, func(i, j int) bool { return before[i].id < before[j].id })
	if len(before) < 2 || before[0].pid <= 0 {
		return nil, fmt.Errorf("want 2 live workers with pids in pool %s, status shows %+v", pool, before)
	}
	return before, nil
}

// failureRun is the failure bench's system under load: the caller that sends the load,
// and what its replies say of the replacement worker.
type failureRun struct {
	sys   *system
	cl    *caller
	load  *asyncLoad
	known []string // the workers before the kill
	// killedAt is the kill's time (unix ns; 0 before it); servedAgain gets the time of
	// the first result, after it, from a worker not known before.
	killedAt    atomic.Int64
	servedAgain chan time.Time
}

func newFailureRun(sys *system, before []procWorker) (*failureRun, error) {
	cl, err := newCaller(sys.nc)
	if err != nil {
		return nil, err
	}
	return &failureRun{sys: sys, cl: cl, known: []string{before[0].id, before[1].id}, servedAgain: make(chan time.Time, 1)}, nil
}

// watchReplies gives back each reply's load slot, and watches for the first result of a
// new worker after the kill.
func (f *failureRun) watchReplies() {
	f.cl.setOnReply(func(k *call) {
		if at := f.killedAt.Load(); at != 0 && k.Code == "" && !slices.Contains(f.known, k.Worker) && k.Recv.UnixNano() > at {
			select {
			case f.servedAgain <- k.Recv:
			default:
			}
		}
		f.load.release()
	})
}

// killHolding asks the victim for what it holds until it holds something, then kills it
// at once (SIGKILL); it returns the requests it held and the kill's time.
func (f *failureRun) killHolding(victim procWorker) ([]string, time.Time, error) {
	statsSubj, _ := subjects.Worker(victim.id, subjects.VerbStats)
	for try := 0; try < 50; try++ {
		m, err := f.sys.nc.Request(statsSubj, []byte{0x80}, 2*time.Second)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("stats of %s: %w", victim.id, err)
		}
		var hb codec.Heartbeat
		if err := codec.Unmarshal(m.Data, &hb); err != nil {
			return nil, time.Time{}, err
		}
		if len(hb.Held) == 0 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err := syscall.Kill(victim.pid, syscall.SIGKILL); err != nil {
			return nil, time.Time{}, fmt.Errorf("kill -9 %d (%s): %w", victim.pid, victim.id, err)
		}
		kill := time.Now()
		f.killedAt.Store(kill.UnixNano())
		return hb.Held, kill, nil
	}
	return nil, time.Time{}, fmt.Errorf("worker %s never held a request under load", victim.id)
}

// replacement is a new worker seen live in the gateway's status.
type replacement struct {
	at time.Time
	id string
}

// watchLive polls the gateway's status until it shows a ready worker of the pool not
// known before, and sends it on the channel.
func (f *failureRun) watchLive(ctx context.Context) <-chan replacement {
	ch := make(chan replacement, 1)
	go func() {
		for ctx.Err() == nil {
			if st, err := f.sys.status(ctx); err == nil {
				for _, x := range st.Workers {
					if x.Pool == failurePool && x.State == codec.StateReady && !slices.Contains(f.known, x.Worker) && x.HeartbeatAgeMS >= 0 {
						ch <- replacement{time.Now(), x.Worker}
						return
					}
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return ch
}

// awaitReplacement waits (30 s at most: then a note says so) until the replacement
// worker is live in the status and has served a result, and records both times.
func (f *failureRun) awaitReplacement(ctx context.Context, kill time.Time, res *FailureResults, rep *Report) error {
	liveCtx, stopLive := context.WithCancel(ctx)
	defer stopLive()
	liveCh := f.watchLive(liveCtx)
	bound := time.After(30 * time.Second)
	gotLive, gotServed := false, false
	for !(gotLive && gotServed) {
		select {
		case l := <-liveCh:
			gotLive, res.ReplacementLiveMS, res.Replaced = true, ms(l.at.Sub(kill)), l.id
		case at := <-f.servedAgain:
			gotServed, res.ServingAgainMS = true, ms(at.Sub(kill))
		case <-bound:
			rep.note("no replacement worker served within 30 s of the kill (live: %v, served: %v)", gotLive, gotServed)
			gotLive, gotServed = true, true
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// tally counts the answers of every call and of the held requests, and the time from the
// kill until the last held one was answered.
func (res *FailureResults) tally(calls []call, held []string, kill time.Time) {
	byID := map[string]call{}
	for _, k := range calls {
		byID[k.ID] = k
		res.Sent++
		if !k.Done {
			continue
		}
		res.Answered++
		res.Outcomes[orDefault(k.Code, "ok")]++
	}
	res.Lost = res.Sent - res.Answered
	var last time.Duration
	for _, id := range held {
		k, ok := byID[id]
		if !ok {
			res.HeldOutcomes["not_ours"]++
			continue
		}
		if !k.Done {
			res.HeldOutcomes["unanswered"]++
			continue
		}
		res.HeldOutcomes[orDefault(k.Code, "ok")]++
		last = max(last, k.Recv.Sub(kill))
	}
	res.AnsweredMS = ms(last)
}

// print prints the table and the targets' verdicts, and notes the targets missed.
func (res *FailureResults) print(out io.Writer, rep *Report, load time.Duration) {
	fmt.Fprintf(out, "failure: pool of 2 workers, %d requests in flight (tagger-heavy ~45 ms each), kill -9 of %s (pid %d) after %v of load\n",
		res.InFlight, res.Killed, res.KilledPID, load)
	printTable(out, "held\tanswered_ms\tlost\tsent\treplacement live ms\tserving_again_ms\theld outcomes\tall outcomes\t",
		fmt.Sprintf("%d\t%.1f\t%d\t%d\t%.1f\t%.1f\t%v\t%v\t", res.Held, res.AnsweredMS, res.Lost, res.Sent, res.ReplacementLiveMS, res.ServingAgainMS, res.HeldOutcomes, res.Outcomes))
	okAns, okLost := res.AnsweredMS <= 500 && res.HeldOutcomes["unanswered"] == 0, res.Lost == 0
	fmt.Fprintf(out, "held requests answered within 500 ms: %s; zero lost: %s\n", verdict(okAns), verdict(okLost))
	rep.target(okAns, "the requests the killed worker held were answered %.1f ms after the kill (target <= 500 ms)", res.AnsweredMS)
	rep.target(okLost, "%d requests lost (target 0)", res.Lost)
}
