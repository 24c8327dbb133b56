package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// `bench lease` (issue 32, item 2): how soon an urgent lease waiting for memory is
// granted once a reclaimable lease's holder has given that memory back. Each round:
//
//	ortbus lease --device cpu --bytes 400MiB --class batch \
//	    --on-pressure 'kill -USR1 $ORTBUS_LEASE_PID' -- ortbus bench mem-holder -bytes 400MiB
//
// holds most of the cpu's declared budget (1 GiB × 0.5); once its holder says ready, the
// bench sends one urgent acquire of 200 MiB with wait_ms (client.WaitLease; the baseline:
// an acquire every 10 s, as `ortbus lease --wait` did before): the gateway
// presses the batch lease, the wrapper runs the hook, the holder unmaps its memory and
// prints when ("freed"), the gateway's fresh measure of the holder (gateway/press.go)
// shrinks the lease, and the waiting acquire is granted. The holder's memory is free
// between the start and the end of its unmapping (munmap gives the pages back as it
// goes: 400 MiB take tens of milliseconds, more on a loaded machine), so free → granted
// is given from both (one clock: the same host): from the start, an upper bound of the
// wait for the memory being free; from the end, which is negative when the grant came
// while the unmapping went on (the room was there before its end).

// LeaseResults are the results of `bench lease`: the urgent lease waiting in the gateway
// (wait_ms), and the baseline of the same run, the way `ortbus lease --wait` waited
// before: an acquire every ttl/3 (10 s with the default ttl) until one is granted.
type LeaseResults struct {
	Device string `json:"device"`
	// EP is where the holder's memory is: cpu (the host's, mapped), or webgpu (the GPU's,
	// a WebGPU session's initializers: gpuholder.go), with the adapter it ran on.
	EP          string     `json:"ep"`
	Adapter     string     `json:"adapter,omitempty"`
	HeldBytes   int64      `json:"held_bytes"`
	BudgetBytes int64      `json:"budget_bytes"`
	HolderBytes int64      `json:"holder_bytes"`
	UrgentBytes int64      `json:"urgent_bytes"`
	PollEveryMS int64      `json:"poll_every_ms"`
	Wait        LeasePhase `json:"wait"`
	Polling     LeasePhase `json:"polling"`
}

// LeasePhase is one way of waiting's figures over its rounds.
type LeasePhase struct {
	// FreeStartToGrantMS and FreeEndToGrantMS: from the start and from the end of the
	// holder's unmapping to the grant's arrival at the waiting client (p50, max over the
	// rounds); UnmapMS: the unmapping itself.
	FreeStartToGrantP50MS float64 `json:"free_start_to_grant_p50_ms"`
	FreeStartToGrantMaxMS float64 `json:"free_start_to_grant_max_ms"`
	FreeEndToGrantP50MS   float64 `json:"free_end_to_grant_p50_ms"`
	FreeEndToGrantMaxMS   float64 `json:"free_end_to_grant_max_ms"`
	UnmapP50MS            float64 `json:"unmap_p50_ms"`
	// AcquireToFreedMS: from the first acquire's send to the end of the unmapping (the
	// press, the gate's publish, the wrapper's hook, the holder's signal and munmap).
	AcquireToFreedP50MS float64 `json:"acquire_to_freed_p50_ms"`
	// AcquireToGrantMS: from the first acquire's send to the grant.
	AcquireToGrantP50MS float64 `json:"acquire_to_grant_p50_ms"`
	AcquireToGrantMaxMS float64 `json:"acquire_to_grant_max_ms"`
	// AcquireRequests are the urgent acquires seen on ortbus.v1.lease.
	AcquireRequests int64        `json:"acquire_requests"`
	Rounds          []LeaseRound `json:"rounds"`
}

// LeaseRound is one round's figures.
type LeaseRound struct {
	FreeStartToGrantMS float64 `json:"free_start_to_grant_ms"`
	FreeEndToGrantMS   float64 `json:"free_end_to_grant_ms"`
	UnmapMS            float64 `json:"unmap_ms"`
	AcquireToFreedMS   float64 `json:"acquire_to_freed_ms"`
	AcquireToGrantMS   float64 `json:"acquire_to_grant_ms"`
	// ShrunkTo is the holder's lease after the round's grant, in bytes (its measured
	// resident memory).
	ShrunkTo int64 `json:"shrunk_to_bytes"`
}

// The bench's sizes: the cpu's declared budget, the holder's lease and the urgent one;
// the baseline's poll (ttl/3 of the wrapper's default ttl) and its rounds (at most).
const (
	leaseBenchCapacity = 1 << 30
	leaseBenchHolder   = 400 << 20
	leaseBenchUrgent   = 200 << 20
	leaseBenchPoll     = 10 * time.Second
	leaseBenchPolls    = 3
	// leaseBenchGPUHeld is what the GPU holder allocates under its 400 MiB lease: its
	// process's own device memory (a Vulkan device, ONNX Runtime's buffers) comes on top.
	leaseBenchGPUHeld = 256 << 20
	// leaseBenchSmokeHeld is what it allocates on lavapipe (a smoke: the host's memory,
	// written by the CPU), which proves the path, not a size.
	leaseBenchSmokeHeld = 64 << 20
)

// leaseTarget is where a run's leases are: the device, and the holder's command's flags.
type leaseTarget struct {
	device string
	holder []string
}

// leaseTargetOf is o's target: the cpu's memory, or with -ep webgpu the GPU's (o.Device,
// else the GPU found; lavapipe's when there is none: a smoke, noted) after the adapter
// is checked to be that GPU. restore undoes the environment it set.
func leaseTargetOf(ctx context.Context, o *Options, w *workdir, res *LeaseResults, rep *Report) (t leaseTarget, restore func(), err error) {
	res.EP, res.HeldBytes = orDefault(o.EP, "cpu"), leaseBenchHolder
	switch res.EP {
	case "cpu":
		return leaseTarget{device: "cpu", holder: []string{"-bytes", fmt.Sprint(leaseBenchHolder)}}, func() {}, nil
	case "webgpu":
	default:
		return t, nil, fmt.Errorf("bench lease: -ep %s: want cpu or webgpu", o.EP)
	}
	lib, err := o.runtimeLib("1.30.0")
	if err != nil {
		return t, nil, err
	}
	gpu := detectGPU()
	_, pick, err := probeAdapter(ctx)
	if err != nil {
		return t, nil, fmt.Errorf("bench lease -ep webgpu: %w", err)
	}
	if err := gpu.checkAdapter(pick); err != nil {
		return t, nil, fmt.Errorf("bench lease -ep webgpu: %w", err)
	}
	res.Adapter, res.HeldBytes = pick.String(), leaseBenchGPUHeld
	t.device = orDefault(o.Device, orDefault(gpu.Device, "cpu"))
	if gpu.Device == "" {
		res.HeldBytes = leaseBenchSmokeHeld
		rep.note("%s: the holder's memory is lavapipe's, in the host's (%s; adapter %s)", SmokeLabel, gpu.What, res.Adapter)
	}
	t.holder = []string{"-ep", "webgpu", "-runtime", lib, "-bytes", fmt.Sprint(res.HeldBytes)}
	restore, err = webgpuEnv(w.dir)
	return t, restore, err
}

// urgentAcquire gets the round's urgent lease of req, one way or the other.
type urgentAcquire func(ctx context.Context, sys *system, req *codec.LeaseRequest) (*codec.LeaseReply, error)

// waitInGateway is the way under test: one acquire with wait_ms.
func waitInGateway(ctx context.Context, sys *system, req *codec.LeaseRequest) (*codec.LeaseReply, error) {
	return sys.cl.WaitLease(ctx, req, 50*time.Second)
}

// pollEvery is the baseline: an acquire every leaseBenchPoll until one is granted.
func pollEvery(ctx context.Context, sys *system, req *codec.LeaseRequest) (*codec.LeaseReply, error) {
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := sys.cl.Lease(c, req)
		cancel()
		if err == nil || codec.CodeOf(err) != codec.CodeOverloaded {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(leaseBenchPoll):
		}
	}
}

// Lease runs o.N rounds (default 10) of a reclaimable lease giving way to an urgent
// waiting one, and min(o.N, leaseBenchPolls) of the polling baseline, and reports free →
// granted.
func Lease(ctx context.Context, o Options) (*Report, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	ortbus := filepath.Join(o.BinDir, "ortbus")
	if !isFile(ortbus) {
		return nil, fmt.Errorf("bench: %s is missing (the holder runs under `ortbus lease`): run `make build`", ortbus)
	}
	w, err := newBareWorkdir(&o)
	if err != nil {
		return nil, err
	}
	defer w.close()
	rep := newReport("lease")
	defer rep.finish()
	res := &LeaseResults{BudgetBytes: leaseBenchCapacity / 2, HolderBytes: leaseBenchHolder, UrgentBytes: leaseBenchUrgent,
		PollEveryMS: leaseBenchPoll.Milliseconds()}
	rep.Results = res
	target, restore, err := leaseTargetOf(ctx, &o, w, res, rep)
	if err != nil {
		return nil, err
	}
	defer restore()
	res.Device = target.device
	cfg, err := w.writeConfig(&o, "lease", sysConfig{Images: w.images,
		Devices: map[string]config.Device{target.device: {Capacity: leaseBenchCapacity, SafeFraction: 0.5}}})
	if err != nil {
		return nil, err
	}
	var acquires atomic.Int64
	sys, err := startSystemThen(ctx, &o, w, "lease", cfg, func(nc *nats.Conn) error { return countAcquires(nc, &acquires) })
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	n := positiveOr(o.N, 10)
	if res.Wait, err = leasePhase(ctx, &o, w, sys, ortbus, target, "wait", n, waitInGateway, &acquires, rep); err != nil {
		return nil, err
	}
	if res.Polling, err = leasePhase(ctx, &o, w, sys, ortbus, target, "poll", min(n, leaseBenchPolls), pollEvery, &acquires, rep); err != nil {
		return nil, err
	}
	res.print(o.out(), rep, n)
	return rep, nil
}

// leasePhase runs rounds rounds of the way acquire, and sums them up; acquires counts the
// urgent acquires on the bus.
func leasePhase(ctx context.Context, o *Options, w *workdir, sys *system, ortbus string, target leaseTarget, name string, rounds int, acquire urgentAcquire,
	acquires *atomic.Int64, rep *Report) (LeasePhase, error) {
	var ph LeasePhase
	var fromStart, fromEnd, unmap, freed, grant []time.Duration
	before := acquires.Load()
	for i := range rounds {
		r, err := leaseRound(ctx, o, w, sys, ortbus, target, fmt.Sprint(name, "-", i), acquire)
		if err != nil {
			return ph, fmt.Errorf("%s round %d: %w", name, i+1, err)
		}
		ph.Rounds = append(ph.Rounds, r.figures())
		fromStart, fromEnd = append(fromStart, r.grant.Sub(r.freeing)), append(fromEnd, r.grant.Sub(r.freed))
		unmap, freed, grant = append(unmap, r.freed.Sub(r.freeing)), append(freed, r.freed.Sub(r.sent)), append(grant, r.grant.Sub(r.sent))
		if r.grant.Before(r.freeing) {
			rep.note("%s round %d: granted before the holder began to free its memory", name, i+1)
		}
	}
	ph.AcquireRequests = acquires.Load() - before
	s, e, g := summarize(fromStart), summarize(fromEnd), summarize(grant)
	ph.FreeStartToGrantP50MS, ph.FreeStartToGrantMaxMS = ms(s.P50), ms(s.Max)
	ph.FreeEndToGrantP50MS, ph.FreeEndToGrantMaxMS = ms(e.P50), ms(e.Max)
	ph.UnmapP50MS, ph.AcquireToFreedP50MS = ms(summarize(unmap).P50), ms(summarize(freed).P50)
	ph.AcquireToGrantP50MS, ph.AcquireToGrantMaxMS = ms(g.P50), ms(g.Max)
	return ph, nil
}

// print writes the results' table, and the targets' verdicts: granted within 1 s of the
// memory being free, from one acquire a round.
func (res *LeaseResults) print(out io.Writer, rep *Report, rounds int) {
	fmt.Fprintf(out, "lease: an urgent %d MiB lease waiting behind a reclaimable %d MiB one on %s (budget %d MiB); its holder holds %d MiB of %s memory\n",
		res.UrgentBytes>>20, res.HolderBytes>>20, res.Device, res.BudgetBytes>>20, res.HeldBytes>>20, map[string]string{"cpu": "the host's", "webgpu": "webgpu (" + res.Adapter + ")"}[res.EP])
	row := func(what string, w, p float64) string { return fmt.Sprintf("%s\t%.1f\t%.1f", what, w, p) }
	wt, pl := &res.Wait, &res.Polling
	printTable(out, fmt.Sprintf("ms\twait_ms (%d rounds)\tpolling every %v (%d rounds)", len(wt.Rounds), leaseBenchPoll, len(pl.Rounds)),
		row("free (unmap start) -> granted, p50", wt.FreeStartToGrantP50MS, pl.FreeStartToGrantP50MS),
		row("free (unmap start) -> granted, max", wt.FreeStartToGrantMaxMS, pl.FreeStartToGrantMaxMS),
		row("free (unmap end) -> granted, p50", wt.FreeEndToGrantP50MS, pl.FreeEndToGrantP50MS),
		row("free (unmap end) -> granted, max", wt.FreeEndToGrantMaxMS, pl.FreeEndToGrantMaxMS),
		row("unmap start -> end, p50", wt.UnmapP50MS, pl.UnmapP50MS),
		row("acquire -> unmap end, p50", wt.AcquireToFreedP50MS, pl.AcquireToFreedP50MS),
		row("acquire -> granted, p50", wt.AcquireToGrantP50MS, pl.AcquireToGrantP50MS),
		row("acquire -> granted, max", wt.AcquireToGrantMaxMS, pl.AcquireToGrantMaxMS))
	fmt.Fprintf(out, "urgent acquires sent: %d waiting in the gateway (%d rounds), %d polling (%d rounds)\n",
		wt.AcquireRequests, len(wt.Rounds), pl.AcquireRequests, len(pl.Rounds))
	rep.target(wt.FreeStartToGrantMaxMS <= 1000, "an urgent lease granted %.1f ms after its holder began to free the memory (target: within 1 s)", wt.FreeStartToGrantMaxMS)
	rep.target(wt.AcquireRequests == int64(rounds), "%d urgent acquires for %d rounds waiting in the gateway", wt.AcquireRequests, rounds)
}

// countAcquires counts the urgent acquires on ortbus.v1.lease (a plain subscription: it
// sees each request beside the gateway that answers it).
func countAcquires(nc *nats.Conn, n *atomic.Int64) error {
	subj, err := subjects.API(subjects.OpLease)
	if err != nil {
		return err
	}
	_, err = nc.Subscribe(subj, func(m *nats.Msg) {
		var req codec.LeaseRequest
		if codec.Unmarshal(m.Data, &req) == nil && req.Action == codec.LeaseAcquire && req.Class == subjects.ClassUrgent {
			n.Add(1)
		}
	})
	if err == nil {
		err = nc.Flush()
	}
	return err
}

// leaseRoundTimes are one round's instants.
type leaseRoundTimes struct {
	sent, freeing, freed, grant time.Time
	shrunk                      int64
}

func (r *leaseRoundTimes) figures() LeaseRound {
	return LeaseRound{FreeStartToGrantMS: ms(r.grant.Sub(r.freeing)), FreeEndToGrantMS: ms(r.grant.Sub(r.freed)), UnmapMS: ms(r.freed.Sub(r.freeing)),
		AcquireToFreedMS: ms(r.freed.Sub(r.sent)), AcquireToGrantMS: ms(r.grant.Sub(r.sent)), ShrunkTo: r.shrunk}
}

// leaseRound runs one round: the holder started and ready, the urgent acquire waiting
// until granted, the holder's freed line, the urgent lease released and the holder
// stopped (its wrapper releases its lease).
func leaseRound(ctx context.Context, o *Options, w *workdir, sys *system, ortbus string, target leaseTarget, name string, acquire urgentAcquire) (*leaseRoundTimes, error) {
	h, err := startMemHolder(ortbus, sys.ready.NATSURL, target, filepath.Join(w.dir, "holder-"+name+".log"), o.Logs)
	if err != nil {
		return nil, err
	}
	defer h.stop()
	if _, err := h.next(ctx, MemHolderReady); err != nil {
		return nil, err
	}
	r := &leaseRoundTimes{sent: time.Now()}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l, err := acquire(wctx, sys, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: target.device, Bytes: leaseBenchUrgent, Class: subjects.ClassUrgent, Holder: "urgent", TTLMS: 60_000})
	r.grant = time.Now()
	if err != nil {
		return nil, fmt.Errorf("the urgent lease: %w; the holder's log:\n%s", err, h.logTail())
	}
	ev, err := h.next(ctx, MemHolderFreed)
	if err != nil {
		return nil, err
	}
	r.freeing, r.freed = time.UnixMicro(ev.StartUnixUS), time.UnixMicro(ev.UnixUS)
	if st, err := sys.status(ctx); err == nil {
		for _, d := range st.Devices {
			for _, x := range d.Leases {
				if d.Device == target.device && x.Holder == "mem-holder" {
					r.shrunk = x.Bytes
				}
			}
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	if _, err := sys.cl.ReleaseLease(rctx, l.Lease); err != nil {
		return nil, fmt.Errorf("release the urgent lease: %w", err)
	}
	return r, h.stop()
}

// memHolder is `ortbus lease ... -- ortbus bench mem-holder` running: its stdout's
// events, its stderr in a log file.
type memHolder struct {
	cmd    *exec.Cmd
	log    string
	events chan MemHolderEvent
	exited chan struct{}
	err    error
}

// startMemHolder starts the holder under its reclaimable batch lease of target's device on
// the bus at url.
func startMemHolder(ortbus, url string, target leaseTarget, log string, tee io.Writer) (*memHolder, error) {
	h := &memHolder{log: log, events: make(chan MemHolderEvent, 8), exited: make(chan struct{})}
	h.cmd = exec.Command(ortbus, append([]string{"lease", "-s", url, "--device", target.device, "--bytes", fmt.Sprint(leaseBenchHolder), "--class", subjects.ClassBatch,
		"--holder", "mem-holder", "--on-pressure", "kill -USR1 $ORTBUS_LEASE_PID", "--", ortbus, "bench", "mem-holder"}, target.holder...)...)
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	h.cmd.Stderr = f
	if tee != nil {
		h.cmd.Stderr = io.MultiWriter(f, tee)
	}
	out, err := h.cmd.StdoutPipe()
	if err == nil {
		err = h.cmd.Start()
	}
	f.Close()
	if err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev MemHolderEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event != "" {
				h.events <- ev
			}
		}
		h.err = h.cmd.Wait()
		close(h.exited)
	}()
	return h, nil
}

// next waits for the holder's next event, which must be want.
func (h *memHolder) next(ctx context.Context, want string) (MemHolderEvent, error) {
	select {
	case ev := <-h.events:
		if ev.Event != want {
			return ev, fmt.Errorf("the holder said %q, want %q", ev.Event, want)
		}
		return ev, nil
	case <-h.exited:
		return MemHolderEvent{}, fmt.Errorf("the holder exited (%v) before %q; its log:\n%s", h.err, want, h.logTail())
	case <-time.After(startBound):
		return MemHolderEvent{}, fmt.Errorf("no %q from the holder within %v; its log:\n%s", want, startBound, h.logTail())
	case <-ctx.Done():
		return MemHolderEvent{}, ctx.Err()
	}
}

// stop stops the wrapper (SIGTERM: it passes it to the holder and releases its lease),
// killing its group past stopBound; an error when it had to.
func (h *memHolder) stop() error {
	select {
	case <-h.exited:
		return nil
	default:
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
		return nil
	case <-time.After(stopBound):
		syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
		<-h.exited
		return fmt.Errorf("the holder's wrapper did not stop within %v; its log:\n%s", stopBound, h.logTail())
	}
}

// logTail is the end of the wrapper's log.
func (h *memHolder) logTail() string {
	b, _ := os.ReadFile(h.log)
	return string(b[max(0, len(b)-4096):])
}
