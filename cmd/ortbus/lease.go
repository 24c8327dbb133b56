package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/gate"
	"github.com/ortbus/ortbus/subjects"
)

const leaseUsage = `usage: ortbus lease [-s URL] --device D --bytes SIZE [--class interactive] [--ttl 30s]
                    [--holder NAME] [--wait DURATION] [--gate [--max-pause 250ms] [--min-share 0.5]]
                    [--on-pressure CMD2 [--on-relief CMD3]] [-inbox-prefix P] -- CMD ARGS...
  Holds SIZE (e.g. 6GiB) of device D's memory budget for CMD, a process ortbus does not
  run (an LLM server, a game): acquires a lease, runs CMD, renews the lease while CMD
  lives, releases it when CMD exits, and exits with CMD's status. Refused (the budget
  cannot hold it), it exits 1 without starting CMD; with --wait DURATION the gateway
  keeps the acquire waiting up to DURATION and grants it the moment room is made (a
  release, a reclaimable lease shrunk, ...), in class order. While an urgent or
  interactive lease is held, batch work on the device is held to one unit.
  --gate: CMD is paused while work of the device's gating class (default urgent) is
  queued for or running on the device, and resumed when it is done; a pause lasts at
  most --max-pause, CMD keeps at least --min-share of every second, and it is resumed
  when the gateway or the bus goes away and whenever the wrapper exits. Pauses use the
  cgroup v2 freezer when the wrapper can make a cgroup, else SIGSTOP/SIGCONT of CMD's
  process group (--pause-by auto|freezer|signal).
  --on-pressure CMD2: when a higher class needs the memory this lease holds, CMD2 runs
  (sh -c; ORTBUS_LEASE_PID, ORTBUS_LEASE_DEVICE, ORTBUS_LEASE_BYTES in its environment),
  e.g. asking the LLM server to unload its model; the gateway then shrinks the lease to
  what CMD's processes are measured to use.
  --on-relief CMD3: the way back: once the pressing work is done (nothing presses the
  device, no acquire waits there, no worker starts there) and the lease's bytes fit the
  budget again, the lease is grown back to SIZE and CMD3 runs (sh -c, the same
  environment), e.g. asking the server to load its model again. Asked for every 500ms
  after a press.
  SIZE should cover what CMD uses: a lease below CMD's measured memory is warned of, with
  both figures (pressing it could shrink nothing; the rest counts as foreign memory).
`

// leaseCmd is `ortbus lease ... -- CMD ARGS...`: it reads the flags, acquires the lease,
// starts CMD, follows the lease's gate and renews the lease while CMD lives, and exits
// with CMD's status. The defers run in the order that leaves nothing behind: the gate
// stopped (CMD resumed), the hook ended, the pauser closed, the lease released.
func leaseCmd(args []string) int {
	o, ok := parseLeaseFlags(args)
	if !ok {
		return 2
	}
	c, err := (jobFlags{url: o.url, prefix: o.prefix}).connect(true)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
		return 1
	}
	defer c.Close()
	host, _ := os.Hostname()
	l := &leaseRun{o: o, c: c, host: host}
	sigs := l.catchSignals()
	defer signal.Stop(sigs)
	if !l.acquire(sigs) {
		return 1
	}
	defer l.release()
	gateMsgs, err := l.followGate()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: cannot follow the gate of %s (granted by gateway %q): %v\n", o.device, l.lease.Gateway, err)
		return 1
	}
	cmd := exec.Command(o.args[0], o.args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	var pauser gate.Pauser
	if o.gated {
		start, err := gate.Prepare(cmd, o.pauseBy)
		if err == nil {
			pauser, err = start()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
			return 127
		}
		// Rule 5 of internal/gate: whatever way the wrapper leaves (CMD's exit, a
		// signal passed on, a panic), CMD is resumed.
		defer pauser.Close()
		fmt.Fprintf(os.Stderr, "ortbus lease: gate: CMD paused by %s while work of the gating class is on %s (max-pause %v, min-share %v)\n", pauser.Kind(), o.device, o.maxPause, o.minShare)
	} else if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
		return 127
	}
	return l.serve(cmd, pauser, sigs, gateMsgs)
}

// leaseOpts are `ortbus lease`'s flags and CMD.
type leaseOpts struct {
	url, prefix                                *string
	device, class, holder, pauseBy, onPressure string
	onRelief                                   string
	bytes                                      config.Bytes
	ttl, maxPause                              time.Duration
	minShare                                   float64
	wait                                       time.Duration // 0: no wait
	gated                                      bool
	args                                       []string // CMD ARGS...
}

// parseLeaseFlags reads `ortbus lease`'s flags; false (the usage or the error said on
// stderr) is exit status 2.
func parseLeaseFlags(args []string) (*leaseOpts, bool) {
	fs := flag.NewFlagSet("lease", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, leaseUsage) }
	url := natsURL(fs)
	prefix := inboxPrefix(fs)
	device := fs.String("device", "", "the device whose memory is leased (as the config names it: cpu, cuda:0, ...)")
	size := fs.String("bytes", "", "how much: bytes, or with a unit (512MiB, 6GiB)")
	class := fs.String("class", "interactive", "the lease's class: urgent and interactive leases hold batch work to one unit")
	ttl := fs.Duration("ttl", 30*time.Second, "the lease's ttl; it is renewed every third of it while CMD runs")
	holder := fs.String("holder", "", "a name for status (default: CMD's name)")
	wait := fs.Duration("wait", 0, "when the budget cannot hold the lease now, wait up to this long in the gateway for room (e.g. 2m)")
	gated := fs.Bool("gate", false, "pause CMD while work of the device's gating class runs there")
	maxPause := fs.Duration("max-pause", 250*time.Millisecond, "with --gate: the longest one pause may last")
	minShare := fs.Float64("min-share", 0.5, "with --gate: the share of every second CMD keeps running (0 to 1)")
	pauseBy := fs.String("pause-by", gate.ByAuto, "with --gate: auto, freezer (cgroup v2) or signal (SIGSTOP/SIGCONT of CMD's process group)")
	onPressure := fs.String("on-pressure", "", "a shell command run when a higher class needs this lease's memory back")
	onRelief := fs.String("on-relief", "", "with --on-pressure: a shell command run when the pressing work is done and the lease's bytes fit again")
	if fs.Parse(args) != nil || fs.NArg() == 0 || *device == "" || *size == "" {
		fmt.Fprint(os.Stderr, leaseUsage)
		return nil, false
	}
	bytes, err := config.ParseBytes(*size)
	if err != nil || bytes <= 0 {
		fmt.Fprintf(os.Stderr, "ortbus lease: --bytes %q: want a size such as 512MiB\n", *size)
		return nil, false
	}
	if *wait < 0 {
		fmt.Fprintf(os.Stderr, "ortbus lease: --wait %v: want a duration >= 0\n", *wait)
		return nil, false
	}
	if *onRelief != "" && *onPressure == "" {
		fmt.Fprintf(os.Stderr, "ortbus lease: --on-relief needs --on-pressure (relief is the way back from a press)\n")
		return nil, false
	}
	if *maxPause < 0 || *minShare < 0 || *minShare > 1 {
		fmt.Fprintf(os.Stderr, "ortbus lease: --max-pause %v, --min-share %v: want a duration >= 0 and a share from 0 to 1\n", *maxPause, *minShare)
		return nil, false
	}
	o := &leaseOpts{url: url, prefix: prefix, device: *device, class: *class, holder: *holder, pauseBy: *pauseBy, onPressure: *onPressure, onRelief: *onRelief,
		bytes: bytes, ttl: *ttl, maxPause: *maxPause, minShare: *minShare, wait: *wait, gated: *gated, args: fs.Args()}
	if o.holder == "" {
		o.holder = o.args[0]
	}
	return o, true
}

// leaseRun is one lease held for CMD.
type leaseRun struct {
	o     *leaseOpts
	c     *client.Client
	host  string
	lease *codec.LeaseReply // once acquired
}

// reclaim is whether the lease may be asked for its memory back (--on-pressure).
func (l *leaseRun) reclaim() bool { return l.o.onPressure != "" }

// call makes one lease request, bounded by a third of the ttl (2s at least).
func (l *leaseRun) call(f func(ctx context.Context) (*codec.LeaseReply, error)) (*codec.LeaseReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(l.o.ttl/3, 2*time.Second))
	defer cancel()
	return f(ctx)
}

// catchSignals returns the channel of the signals the wrapper handles.
// Signals reach CMD (it shares the terminal's process group; with the signal
// pauser, the wrapper passes them on to CMD's own group); the wrapper waits for it
// to exit and releases the lease then.
func (l *leaseRun) catchSignals() chan os.Signal {
	sigs := make(chan os.Signal, 1)
	if l.o.gated {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT)
	} else {
		signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP)
	}
	return sigs
}

// acquire acquires the lease; with --wait, the gateway keeps it waiting for room (one
// request per codec.MaxLeaseWaitMS of the wait: no asking again in between). False (said
// on stderr, or a signal while it waits) is exit status 1.
func (l *leaseRun) acquire(sigs chan os.Signal) bool {
	o := l.o
	req := &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: o.device, Bytes: int64(o.bytes), Class: o.class, Holder: o.holder, TTLMS: o.ttl.Milliseconds(),
		Gate: o.gated, Reclaim: l.reclaim()}
	if o.wait <= 0 {
		lease, err := l.call(func(ctx context.Context) (*codec.LeaseReply, error) { return l.c.Lease(ctx, req) })
		if err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: refused: %v\n", err)
			return false
		}
		l.lease = lease
		return true
	}
	// A signal while it waits ends the wait (the request's context).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := make(chan struct{})
	defer close(waiting)
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-waiting:
		}
	}()
	for until := time.Now().Add(o.wait); ; {
		lease, err := l.c.WaitLease(ctx, req, time.Until(until))
		switch {
		case ctx.Err() != nil:
			if err == nil {
				l.lease = lease
				l.release() // granted as the signal came: given back
			}
			return false
		case err == nil:
			l.lease = lease
			return true
		case !waitedOut(err) || time.Until(until) < time.Millisecond:
			fmt.Fprintf(os.Stderr, "ortbus lease: refused: %v\n", err)
			return false
		}
		// The gateway's longest wait passed, and --wait's has not: wait again.
	}
}

// waitedOut reports whether err is the gateway's answer to a wait that ran out (overloaded
// with waited_ms), not a refusal at once (the waiters' bound, a bad request).
func waitedOut(err error) bool {
	e := codec.AsError(err)
	_, waited := e.Details["waited_ms"]
	return e.Code == codec.CodeOverloaded && waited
}

// release gives the lease back (said on stderr when it cannot: it expires then).
func (l *leaseRun) release() {
	if _, err := l.call(func(ctx context.Context) (*codec.LeaseReply, error) { return l.c.ReleaseLease(ctx, l.lease.Lease) }); err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: release: %v (it expires within %v)\n", err, l.o.ttl)
	}
}

// followGate subscribes to the gate this lease follows, and the pressure on it
// (ortbus.gate.<gateway>.<device>), when --gate or --on-pressure asks for it.
func (l *leaseRun) followGate() (chan *nats.Msg, error) {
	gateMsgs := make(chan *nats.Msg, 64)
	if !l.o.gated && !l.reclaim() {
		return gateMsgs, nil
	}
	subj, err := subjects.Gate(l.lease.Gateway, l.o.device)
	if err == nil {
		_, err = l.c.Conn().ChanSubscribe(subj, gateMsgs)
	}
	return gateMsgs, err
}

// renew renews the lease, telling the gateway CMD's pid and host; bytes > 0 asks for
// relief (the lease back at bytes: leaserelief.go).
func (l *leaseRun) renew(pid int, bytes int64) (*codec.LeaseReply, error) {
	req := &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: l.lease.Lease, TTLMS: l.o.ttl.Milliseconds(), PID: pid, Host: l.host, Bytes: bytes}
	return l.call(func(ctx context.Context) (*codec.LeaseReply, error) { return l.c.Lease(ctx, req) })
}

// serve holds the lease while CMD runs: it renews it, follows the gate (pausing and
// resuming CMD when pauser is set), runs the on-pressure and on-relief hooks, warns of a
// lease below CMD's measured memory, passes signals on, and returns CMD's exit status
// once it exits.
func (l *leaseRun) serve(cmd *exec.Cmd, pauser gate.Pauser, sigs chan os.Signal, gateMsgs chan *nats.Msg) int {
	o := l.o
	pid := cmd.Process.Pid
	rc := newLeaseReclaim(o, pid)
	defer rc.stop()
	if l.reclaim() {
		// The holder's pid, for the measure of its usage (gateway/lease.go, rule 6).
		if _, err := l.renew(pid, 0); err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: renew: %v\n", err)
		}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	renew := time.NewTicker(max(o.ttl/3, 100*time.Millisecond))
	defer renew.Stop()
	relief, measure := rc.tickers()
	defer relief.Stop()
	defer measure.Stop()
	g := newGateFollower(pauser, o, l.c.Conn())
	defer g.timer.Stop()
	defer g.stop()
	myTag := codec.LeaseTag(l.lease.Lease)
	for {
		select {
		case err := <-exited:
			g.stop()
			return exitStatus(err)
		case s := <-sigs:
			// Rule 5 of internal/gate: CMD runs again before it gets the signal, and is
			// paused no more.
			g.stop()
			passSignal(cmd, pauser, s)
		case <-renew.C:
			r, err := l.renew(pid, rc.reliefBytes())
			if err != nil {
				// Not fatal for CMD: the gateway may be restarting; the lease may lapse.
				fmt.Fprintf(os.Stderr, "ortbus lease: renew: %v\n", err)
			} else {
				rc.renewed(r)
			}
		case <-relief.C:
			if b := rc.reliefBytes(); b > 0 {
				if r, err := l.renew(pid, b); err == nil {
					rc.renewed(r)
				}
			}
		case <-measure.C:
			rc.measure()
		case msg := <-gateMsgs:
			var st codec.Gate
			// Every byte from the bus is hostile: a state that does not decode, or is not
			// this lease's gateway's for this device, is dropped (rule 6 bounds the rest).
			if codec.Unmarshal(msg.Data, &st) != nil || st.Validate() != nil || st.Gateway != l.lease.Gateway || st.Device != o.device {
				continue
			}
			g.gate(&st)
			rc.pressed(slices.Contains(st.Reclaim, myTag))
		case lost := <-g.lost:
			g.follow(func(m *gate.Machine, now time.Time) gate.Action { return m.Lost(now, lost) })
		case <-g.timer.C:
			g.follow((*gate.Machine).Tick)
		}
	}
}

// exitStatus is the wrapper's exit status for CMD's end: CMD's own, 128+N for a
// signal N, 1 when it could not be waited for.
func exitStatus(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			return 128 + int(st.Signal())
		}
		return ee.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
		return 1
	}
}

// passSignal passes a signal the wrapper caught on to CMD.
func passSignal(cmd *exec.Cmd, pauser gate.Pauser, s os.Signal) {
	sig := s.(syscall.Signal)
	switch {
	case pauser != nil && pauser.Kind() == gate.BySignal:
		syscall.Kill(-cmd.Process.Pid, sig) // CMD's own process group, off the terminal's
	case sig == syscall.SIGINT || sig == syscall.SIGQUIT:
		// From the terminal, they reached CMD (in the terminal's group) too.
	default:
		cmd.Process.Signal(s)
	}
}

// gateFollower is the gate follower: internal/gate's machine decides, the pauser acts.
// Without a pauser (no --gate) it does nothing.
type gateFollower struct {
	m      *gate.Machine
	pauser gate.Pauser
	timer  *time.Timer // the machine's next tick
	lost   chan bool   // the bus lost (true) and back (false)
}

// newGateFollower makes the follower of pauser and has it told when the bus goes away
// and comes back.
func newGateFollower(pauser gate.Pauser, o *leaseOpts, nc *nats.Conn) *gateFollower {
	g := &gateFollower{m: gate.New(gate.Limits{MaxPause: o.maxPause, MinShare: o.minShare}), pauser: pauser,
		timer: time.NewTimer(time.Hour), lost: make(chan bool, 8)}
	nc.SetDisconnectErrHandler(func(*nats.Conn, error) { notify(g.lost, true) })
	nc.SetReconnectHandler(func(*nats.Conn) { notify(g.lost, false) })
	nc.SetClosedHandler(func(*nats.Conn) { notify(g.lost, true) })
	return g
}

// act carries out the machine's action and sets the timer for its next tick.
func (g *gateFollower) act(a gate.Action, now time.Time) {
	switch a {
	case gate.Pause:
		if err := g.pauser.Pause(); err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: gate: pause: %v\n", err)
		}
		fmt.Fprintf(os.Stderr, "ortbus lease: gate: paused #%d\n", g.m.Pauses())
	case gate.Resume:
		// Said before it is done: a reader of these lines knows CMD was paused all
		// the way from "paused" to "resuming".
		fmt.Fprintf(os.Stderr, "ortbus lease: gate: resuming #%d (%s)\n", g.m.Pauses(), g.m.Why())
		if err := g.pauser.Resume(); err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: gate: resume: %v\n", err)
		}
	}
	g.timer.Stop()
	if next := g.m.Next(now); !next.IsZero() {
		g.timer.Reset(max(next.Sub(time.Now()), 0))
	}
}

// follow feeds the machine one event (now) and acts on its answer, when there is a pauser.
func (g *gateFollower) follow(event func(m *gate.Machine, now time.Time) gate.Action) {
	if g.pauser != nil {
		now := time.Now()
		g.act(event(g.m, now), now)
	}
}

// gate feeds the machine a gate state from the bus.
func (g *gateFollower) gate(st *codec.Gate) {
	g.follow(func(m *gate.Machine, now time.Time) gate.Action {
		return m.Gate(now, st.Closed, time.Duration(st.TTLMS)*time.Millisecond, st.Seq)
	})
}

// stop stops the machine: CMD is resumed and paused no more.
func (g *gateFollower) stop() {
	g.follow((*gate.Machine).Stop)
}

// notify sends v on ch without blocking (a full channel has news enough).
func notify(ch chan bool, v bool) {
	select {
	case ch <- v:
	default:
	}
}
