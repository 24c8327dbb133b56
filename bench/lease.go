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
// bench sends one urgent acquire of 200 MiB with wait_ms (client.WaitLease): the gateway
// presses the batch lease, the wrapper runs the hook, the holder unmaps its memory and
// prints when ("freed"), the gateway's fresh measure of the holder (gateway/press.go)
// shrinks the lease, and the waiting acquire is granted. The holder's memory is free
// between the start and the end of its unmapping (munmap gives the pages back as it
// goes: 400 MiB take tens of milliseconds, more on a loaded machine), so free → granted
// is given from both (one clock: the same host): from the start, an upper bound of the
// wait for the memory being free; from the end, which is negative when the grant came
// while the unmapping went on (the room was there before its end).

// LeaseResults are the results of `bench lease`.
type LeaseResults struct {
	Device      string `json:"device"`
	BudgetBytes int64  `json:"budget_bytes"`
	HolderBytes int64  `json:"holder_bytes"`
	UrgentBytes int64  `json:"urgent_bytes"`
	// FreeStartToGrantMS and FreeEndToGrantMS: from the start and from the end of the
	// holder's unmapping to the grant's arrival at the waiting client (p50, max over the
	// rounds); UnmapMS: the unmapping itself.
	FreeStartToGrantP50MS float64 `json:"free_start_to_grant_p50_ms"`
	FreeStartToGrantMaxMS float64 `json:"free_start_to_grant_max_ms"`
	FreeEndToGrantP50MS   float64 `json:"free_end_to_grant_p50_ms"`
	FreeEndToGrantMaxMS   float64 `json:"free_end_to_grant_max_ms"`
	UnmapP50MS            float64 `json:"unmap_p50_ms"`
	// AcquireToFreedMS: from the acquire's send to the end of the unmapping (the press,
	// the gate's publish, the wrapper's hook, the holder's signal and munmap).
	AcquireToFreedP50MS float64 `json:"acquire_to_freed_p50_ms"`
	// AcquireToGrantMS: from the acquire's send to its grant.
	AcquireToGrantP50MS float64 `json:"acquire_to_grant_p50_ms"`
	AcquireToGrantMaxMS float64 `json:"acquire_to_grant_max_ms"`
	// AcquireRequests are the urgent acquires seen on ortbus.v1.lease: one per round
	// (the waiting client never asked again).
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

// The bench's sizes: the cpu's declared budget, the holder's lease and the urgent one.
const (
	leaseBenchCapacity = 1 << 30
	leaseBenchHolder   = 400 << 20
	leaseBenchUrgent   = 200 << 20
)

// Lease runs o.N rounds (default 10) of a reclaimable lease giving way to an urgent
// waiting one, and reports free → granted.
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
	cfg, err := w.writeConfig(&o, "lease", sysConfig{Images: w.images,
		Devices: map[string]config.Device{"cpu": {Capacity: leaseBenchCapacity, SafeFraction: 0.5}}})
	if err != nil {
		return nil, err
	}
	var acquires atomic.Int64
	sys, err := startSystemThen(ctx, &o, w, "lease", cfg, func(nc *nats.Conn) error { return countAcquires(nc, &acquires) })
	if err != nil {
		return nil, err
	}
	defer sys.stop()
	res := &LeaseResults{Device: "cpu", BudgetBytes: leaseBenchCapacity / 2, HolderBytes: leaseBenchHolder, UrgentBytes: leaseBenchUrgent}
	rep.Results = res
	var fromStart, fromEnd, unmap, freed, grant []time.Duration
	for i := range positiveOr(o.N, 10) {
		r, err := leaseRound(ctx, &o, w, sys, ortbus, i)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", i+1, err)
		}
		res.Rounds = append(res.Rounds, r.figures())
		fromStart, fromEnd = append(fromStart, r.grant.Sub(r.freeing)), append(fromEnd, r.grant.Sub(r.freed))
		unmap, freed, grant = append(unmap, r.freed.Sub(r.freeing)), append(freed, r.freed.Sub(r.sent)), append(grant, r.grant.Sub(r.sent))
		if r.grant.Before(r.freeing) {
			rep.note("round %d: granted before the holder began to free its memory", i+1)
		}
	}
	res.AcquireRequests = acquires.Load()
	s, e, g := summarize(fromStart), summarize(fromEnd), summarize(grant)
	res.FreeStartToGrantP50MS, res.FreeStartToGrantMaxMS = ms(s.P50), ms(s.Max)
	res.FreeEndToGrantP50MS, res.FreeEndToGrantMaxMS = ms(e.P50), ms(e.Max)
	res.UnmapP50MS, res.AcquireToFreedP50MS = ms(summarize(unmap).P50), ms(summarize(freed).P50)
	res.AcquireToGrantP50MS, res.AcquireToGrantMaxMS = ms(g.P50), ms(g.Max)
	res.print(o.out(), rep, len(grant))
	return rep, nil
}

// print writes the results' table, and the target's verdict: granted within 1 s of the
// memory being free.
func (res *LeaseResults) print(out io.Writer, rep *Report, rounds int) {
	fmt.Fprintf(out, "lease: an urgent %d MiB lease waiting (wait_ms) behind a reclaimable %d MiB one on %s (budget %d MiB), %d rounds\n",
		res.UrgentBytes>>20, res.HolderBytes>>20, res.Device, res.BudgetBytes>>20, rounds)
	printTable(out, "\tp50 ms\tmax ms",
		fmt.Sprintf("free (unmap start) -> granted\t%.1f\t%.1f", res.FreeStartToGrantP50MS, res.FreeStartToGrantMaxMS),
		fmt.Sprintf("free (unmap end) -> granted\t%.1f\t%.1f", res.FreeEndToGrantP50MS, res.FreeEndToGrantMaxMS),
		fmt.Sprintf("unmap start -> end\t%.1f\t", res.UnmapP50MS),
		fmt.Sprintf("acquire -> unmap end\t%.1f\t", res.AcquireToFreedP50MS),
		fmt.Sprintf("acquire -> granted\t%.1f\t%.1f", res.AcquireToGrantP50MS, res.AcquireToGrantMaxMS))
	fmt.Fprintf(out, "urgent acquires sent: %d (one per round: the waiter never asked again)\n", res.AcquireRequests)
	rep.target(res.FreeStartToGrantMaxMS <= 1000, "an urgent lease granted %.1f ms after its holder began to free the memory (target: within 1 s)", res.FreeStartToGrantMaxMS)
	rep.target(res.AcquireRequests == int64(rounds), "%d urgent acquires for %d rounds", res.AcquireRequests, rounds)
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

// newBareWorkdir is a bench's temporary directory without generated models.
func newBareWorkdir(o *Options) (*workdir, error) {
	dir, err := os.MkdirTemp("", "ortbus-bench-")
	if err != nil {
		return nil, err
	}
	w := &workdir{dir: dir, models: filepath.Join(dir, "models"), images: filepath.Join(dir, "images"), keep: o.KeepTemp}
	if err := os.MkdirAll(w.images, 0o755); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
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
func leaseRound(ctx context.Context, o *Options, w *workdir, sys *system, ortbus string, i int) (*leaseRoundTimes, error) {
	h, err := startMemHolder(ortbus, sys.ready.NATSURL, filepath.Join(w.dir, fmt.Sprintf("holder-%d.log", i)), o.Logs)
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
	l, err := sys.cl.WaitLease(wctx, &codec.LeaseRequest{Device: "cpu", Bytes: leaseBenchUrgent, Class: subjects.ClassUrgent, Holder: "urgent", TTLMS: 60_000}, 50*time.Second)
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
				if d.Device == "cpu" && x.Holder == "mem-holder" {
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

// startMemHolder starts the holder under its reclaimable batch lease on the bus at url.
func startMemHolder(ortbus, url, log string, tee io.Writer) (*memHolder, error) {
	size := fmt.Sprint(leaseBenchHolder)
	h := &memHolder{log: log, events: make(chan MemHolderEvent, 8), exited: make(chan struct{})}
	h.cmd = exec.Command(ortbus, "lease", "-s", url, "--device", "cpu", "--bytes", size, "--class", subjects.ClassBatch, "--holder", "mem-holder",
		"--on-pressure", "kill -USR1 $ORTBUS_LEASE_PID", "--", ortbus, "bench", "mem-holder", "-bytes", size)
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
