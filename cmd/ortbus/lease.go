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
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/gate"
	"github.com/ortbus/ortbus/subjects"
)

const leaseUsage = `usage: ortbus lease [-s URL] --device D --bytes SIZE [--class interactive] [--ttl 30s]
                    [--holder NAME] [--wait] [--gate [--max-pause 250ms] [--min-share 0.5]]
                    [--on-pressure CMD2] [-inbox-prefix P] -- CMD ARGS...
  Holds SIZE (e.g. 6GiB) of device D's memory budget for CMD, a process ortbus does not
  run (an LLM server, a game): acquires a lease, runs CMD, renews the lease while CMD
  lives, releases it when CMD exits, and exits with CMD's status. Refused (the budget
  cannot hold it), it exits 1 without starting CMD, or with --wait tries again until it
  is granted. While an urgent or interactive lease is held, batch work on the device is
  held to one unit.
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
`

// leaseCmd is `ortbus lease ... -- CMD ARGS...`.
func leaseCmd(args []string) int {
	fs := flag.NewFlagSet("lease", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, leaseUsage) }
	url := natsURL(fs)
	prefix := inboxPrefix(fs)
	device := fs.String("device", "", "the device whose memory is leased (as the config names it: cpu, cuda:0, ...)")
	size := fs.String("bytes", "", "how much: bytes, or with a unit (512MiB, 6GiB)")
	class := fs.String("class", "interactive", "the lease's class: urgent and interactive leases hold batch work to one unit")
	ttl := fs.Duration("ttl", 30*time.Second, "the lease's ttl; it is renewed every third of it while CMD runs")
	holder := fs.String("holder", "", "a name for status (default: CMD's name)")
	wait := fs.Bool("wait", false, "when refused, try again every ttl/3 until granted")
	gated := fs.Bool("gate", false, "pause CMD while work of the device's gating class runs there")
	maxPause := fs.Duration("max-pause", 250*time.Millisecond, "with --gate: the longest one pause may last")
	minShare := fs.Float64("min-share", 0.5, "with --gate: the share of every second CMD keeps running (0 to 1)")
	pauseBy := fs.String("pause-by", gate.ByAuto, "with --gate: auto, freezer (cgroup v2) or signal (SIGSTOP/SIGCONT of CMD's process group)")
	onPressure := fs.String("on-pressure", "", "a shell command run when a higher class needs this lease's memory back")
	if fs.Parse(args) != nil || fs.NArg() == 0 || *device == "" || *size == "" {
		fmt.Fprint(os.Stderr, leaseUsage)
		return 2
	}
	bytes, err := config.ParseBytes(*size)
	if err != nil || bytes <= 0 {
		fmt.Fprintf(os.Stderr, "ortbus lease: --bytes %q: want a size such as 512MiB\n", *size)
		return 2
	}
	if *maxPause < 0 || *minShare < 0 || *minShare > 1 {
		fmt.Fprintf(os.Stderr, "ortbus lease: --max-pause %v, --min-share %v: want a duration >= 0 and a share from 0 to 1\n", *maxPause, *minShare)
		return 2
	}
	cmdArgs := fs.Args()
	if *holder == "" {
		*holder = cmdArgs[0]
	}
	c, err := (jobFlags{url: url, prefix: prefix}).connect(true)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
		return 1
	}
	defer c.Close()
	call := func(f func(ctx context.Context) (*codec.LeaseReply, error)) (*codec.LeaseReply, error) {
		ctx, cancel := context.WithTimeout(context.Background(), max(*ttl/3, 2*time.Second))
		defer cancel()
		return f(ctx)
	}
	ttlMS := ttl.Milliseconds()
	host, _ := os.Hostname()
	reclaim := *onPressure != ""
	acquire := func(ctx context.Context) (*codec.LeaseReply, error) {
		return c.Lease(ctx, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: *device, Bytes: int64(bytes), Class: *class, Holder: *holder, TTLMS: ttlMS,
			Gate: *gated, Reclaim: reclaim})
	}
	// Signals reach CMD (it shares the terminal's process group; with the signal
	// pauser, the wrapper passes them on to CMD's own group); the wrapper waits for it
	// to exit and releases the lease then.
	sigs := make(chan os.Signal, 1)
	if *gated {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT)
	} else {
		signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP)
	}
	defer signal.Stop(sigs)
	var lease *codec.LeaseReply
	for {
		lease, err = call(acquire)
		if err == nil {
			break
		}
		if !*wait || codec.CodeOf(err) != codec.CodeOverloaded {
			fmt.Fprintf(os.Stderr, "ortbus lease: refused: %v\n", err)
			return 1
		}
		select {
		case <-sigs:
			return 1
		case <-time.After(max(*ttl/3, 100*time.Millisecond)):
		}
	}
	release := func() {
		if _, err := call(func(ctx context.Context) (*codec.LeaseReply, error) { return c.ReleaseLease(ctx, lease.Lease) }); err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: release: %v (it expires within %v)\n", err, *ttl)
		}
	}
	defer release()

	// The gate this lease follows, and the pressure on it: ortbus.gate.<gateway>.<device>.
	gateMsgs := make(chan *nats.Msg, 64)
	if *gated || reclaim {
		subj, err := subjects.Gate(lease.Gateway, *device)
		if err == nil {
			_, err = c.Conn().ChanSubscribe(subj, gateMsgs)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: cannot follow the gate of %s (granted by gateway %q): %v\n", *device, lease.Gateway, err)
			return 1
		}
	}

	cmd := exec.Command(cmdArgs[0], cmdArgs[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	var pauser gate.Pauser
	if *gated {
		start, err := gate.Prepare(cmd, *pauseBy)
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
		fmt.Fprintf(os.Stderr, "ortbus lease: gate: CMD paused by %s while work of the gating class is on %s (max-pause %v, min-share %v)\n", pauser.Kind(), *device, *maxPause, *minShare)
	} else if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: %v\n", err)
		return 127
	}
	pid := cmd.Process.Pid
	renewReq := func(ctx context.Context) (*codec.LeaseReply, error) {
		return c.Lease(ctx, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: lease.Lease, TTLMS: ttlMS, PID: pid, Host: host})
	}
	hook := &pressureHook{cmd: *onPressure, env: []string{fmt.Sprintf("ORTBUS_LEASE_PID=%d", pid), "ORTBUS_LEASE_DEVICE=" + *device, fmt.Sprintf("ORTBUS_LEASE_BYTES=%d", bytes)}}
	defer hook.stop()
	if reclaim {
		// The holder's pid, for the measure of its usage (gateway/lease.go, rule 6).
		if _, err := call(renewReq); err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: renew: %v\n", err)
		}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	renew := time.NewTicker(max(*ttl/3, 100*time.Millisecond))
	defer renew.Stop()

	// The gate follower: internal/gate's machine decides, the pauser acts.
	m := gate.New(gate.Limits{MaxPause: *maxPause, MinShare: *minShare})
	lost := make(chan bool, 8)
	nc := c.Conn()
	nc.SetDisconnectErrHandler(func(*nats.Conn, error) { notify(lost, true) })
	nc.SetReconnectHandler(func(*nats.Conn) { notify(lost, false) })
	nc.SetClosedHandler(func(*nats.Conn) { notify(lost, true) })
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	act := func(a gate.Action, now time.Time) {
		switch a {
		case gate.Pause:
			if err := pauser.Pause(); err != nil {
				fmt.Fprintf(os.Stderr, "ortbus lease: gate: pause: %v\n", err)
			}
			fmt.Fprintf(os.Stderr, "ortbus lease: gate: paused #%d\n", m.Pauses())
		case gate.Resume:
			// Said before it is done: a reader of these lines knows CMD was paused all
			// the way from "paused" to "resuming".
			fmt.Fprintf(os.Stderr, "ortbus lease: gate: resuming #%d (%s)\n", m.Pauses(), m.Why())
			if err := pauser.Resume(); err != nil {
				fmt.Fprintf(os.Stderr, "ortbus lease: gate: resume: %v\n", err)
			}
		}
		timer.Stop()
		if next := m.Next(now); !next.IsZero() {
			timer.Reset(max(next.Sub(time.Now()), 0))
		}
	}
	stopGate := func() {
		if pauser != nil {
			act(m.Stop(time.Now()), time.Now())
		}
	}
	defer stopGate()
	pressed := false
	onPressed := func(on bool) {
		if on && !pressed && reclaim {
			fmt.Fprintf(os.Stderr, "ortbus lease: a higher class needs the memory of this lease: running the on-pressure hook\n")
			hook.run()
		}
		pressed = on
	}
	myTag := codec.LeaseTag(lease.Lease)
	for {
		select {
		case err := <-exited:
			stopGate()
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
		case s := <-sigs:
			// Rule 5 of internal/gate: CMD runs again before it gets the signal, and is
			// paused no more.
			stopGate()
			sig := s.(syscall.Signal)
			switch {
			case pauser != nil && pauser.Kind() == gate.BySignal:
				syscall.Kill(-pid, sig) // CMD's own process group, off the terminal's
			case sig == syscall.SIGINT || sig == syscall.SIGQUIT:
				// From the terminal, they reached CMD (in the terminal's group) too.
			default:
				cmd.Process.Signal(s)
			}
		case <-renew.C:
			r, err := call(renewReq)
			if err != nil {
				// Not fatal for CMD: the gateway may be restarting; the lease may lapse.
				fmt.Fprintf(os.Stderr, "ortbus lease: renew: %v\n", err)
			} else {
				onPressed(r.Pressed)
			}
		case msg := <-gateMsgs:
			var g codec.Gate
			// Every byte from the bus is hostile: a state that does not decode, or is not
			// this lease's gateway's for this device, is dropped (rule 6 bounds the rest).
			if codec.Unmarshal(msg.Data, &g) != nil || g.Validate() != nil || g.Gateway != lease.Gateway || g.Device != *device {
				continue
			}
			now := time.Now()
			if pauser != nil {
				act(m.Gate(now, g.Closed, time.Duration(g.TTLMS)*time.Millisecond, g.Seq), now)
			}
			onPressed(slices.Contains(g.Reclaim, myTag))
		case l := <-lost:
			if pauser != nil {
				now := time.Now()
				act(m.Lost(now, l), now)
			}
		case <-timer.C:
			if pauser != nil {
				now := time.Now()
				act(m.Tick(now), now)
			}
		}
	}
}

// notify sends v on ch without blocking (a full channel has news enough).
func notify(ch chan bool, v bool) {
	select {
	case ch <- v:
	default:
	}
}

// pressureHook runs the --on-pressure command, one run at a time.
type pressureHook struct {
	cmd     string
	env     []string
	mu      sync.Mutex
	running *exec.Cmd
}

func (h *pressureHook) run() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmd == "" || h.running != nil {
		return
	}
	c := exec.Command("sh", "-c", h.cmd)
	c.Env = append(os.Environ(), h.env...)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := c.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: on-pressure hook: %v\n", err)
		return
	}
	h.running = c
	go func() {
		err := c.Wait()
		if err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: on-pressure hook: %v\n", err)
		}
		h.mu.Lock()
		h.running = nil
		h.mu.Unlock()
	}()
}

// stop ends a hook still running when the wrapper leaves.
func (h *pressureHook) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.running != nil {
		h.running.Process.Kill()
	}
}
