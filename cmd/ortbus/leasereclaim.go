package main

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// The reclaim side of a lease held for CMD (`ortbus lease --on-pressure CMD2
// [--on-relief CMD3]`):
//
//  1. A press (the lease's tag in its device's gate, or a renew's reply that says
//     pressed) runs the on-pressure hook once; the gateway then shrinks the lease to what
//     CMD is measured to use (gateway/lease.go, rule 6).
//  2. After a press, with --on-relief, every renew, and one every reliefEvery while the
//     lease is not pressed, asks for relief: the lease back at its full bytes
//     (gateway/relief.go). The reply that says relief runs the on-relief hook once; the
//     next press starts this over.
//  3. Every measureEvery, CMD's memory on the device (holdermem.go) is held against the
//     lease's bytes; above them, a warning with both figures, once until it falls back.

// reliefEvery is how often relief is asked for after a press (rule 2); measureEvery how
// often CMD's memory is measured (rule 3).
const (
	reliefEvery  = 500 * time.Millisecond
	measureEvery = 2 * time.Second
)

// leaseReclaim is the reclaim state of one lease: its hooks, whether it is pressed, and
// whether it waits for relief.
type leaseReclaim struct {
	o                *leaseOpts
	pid              int
	pressure, relief *leaseHook
	isPressed        bool
	awaiting         bool // the on-pressure hook ran: relief is asked for (rule 2)
	warned           bool // rule 3: said, until the measure falls back within the lease
	// measured is CMD's memory on the device (holderMemory; a test's fake).
	measured func(device string, pid int) (int64, bool)
}

func newLeaseReclaim(o *leaseOpts, pid int) *leaseReclaim {
	env := []string{fmt.Sprintf("ORTBUS_LEASE_PID=%d", pid), "ORTBUS_LEASE_DEVICE=" + o.device, fmt.Sprintf("ORTBUS_LEASE_BYTES=%d", o.bytes)}
	return &leaseReclaim{o: o, pid: pid, measured: holderMemory,
		pressure: &leaseHook{name: "on-pressure", cmd: o.onPressure, env: env},
		relief:   &leaseHook{name: "on-relief", cmd: o.onRelief, env: env}}
}

// tickers are the relief ticker (stopped for good without --on-relief) and the measure's.
func (r *leaseReclaim) tickers() (relief, measure *time.Ticker) {
	relief = time.NewTicker(reliefEvery)
	if r.o.onRelief == "" {
		relief.Stop()
	}
	return relief, time.NewTicker(measureEvery)
}

// pressed takes the lease's press state (from its gate, or a renew's reply): a press
// that starts runs the on-pressure hook (rule 1).
func (r *leaseReclaim) pressed(on bool) {
	if on && !r.isPressed && r.o.onPressure != "" {
		fmt.Fprintf(os.Stderr, "ortbus lease: a higher class needs the memory of this lease: running the on-pressure hook\n")
		r.pressure.run()
		r.awaiting = r.o.onRelief != ""
	}
	r.isPressed = on
}

// reliefBytes is what a renew asks back now: the lease's bytes while relief is awaited
// and the lease is not pressed (rule 2), else 0 (a plain renew).
func (r *leaseReclaim) reliefBytes() int64 {
	if r.awaiting && !r.isPressed {
		return int64(r.o.bytes)
	}
	return 0
}

// renewed takes a renew's reply: its press state, and relief (rule 2).
func (r *leaseReclaim) renewed(rep *codec.LeaseReply) {
	r.pressed(rep.Pressed)
	if rep.Relief && r.awaiting {
		r.awaiting = false
		fmt.Fprintf(os.Stderr, "ortbus lease: the pressing work is done and the lease's %s fit again: running the on-relief hook\n", mibOf(rep.Bytes))
		r.relief.run()
	}
}

// measure holds CMD's memory on the device against the lease's bytes (rule 3).
func (r *leaseReclaim) measure() {
	used, ok := r.measured(r.o.device, r.pid)
	if !ok {
		return
	}
	over := used > int64(r.o.bytes)
	if over && !r.warned {
		fmt.Fprintf(os.Stderr, "ortbus lease: warning: the lease holds %s of %s, but CMD is measured using %s there: pressing it can shrink nothing, and the %s above it counts as foreign memory; lease at least %s\n",
			mibOf(int64(r.o.bytes)), r.o.device, mibOf(used), mibOf(used-int64(r.o.bytes)), mibOf(used))
	}
	r.warned = over
}

// stop ends the hooks still running when the wrapper leaves.
func (r *leaseReclaim) stop() {
	r.pressure.stop()
	r.relief.stop()
}

func mibOf(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// leaseHook runs one hook command (--on-pressure, --on-relief), one run at a time.
type leaseHook struct {
	name    string
	cmd     string
	env     []string
	mu      sync.Mutex
	running *exec.Cmd
	done    chan struct{} // closed when the running one has been waited for
}

func (h *leaseHook) run() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmd == "" || h.running != nil {
		return
	}
	c := exec.Command("sh", "-c", h.cmd)
	c.Env = append(os.Environ(), h.env...)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := c.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "ortbus lease: %s hook: %v\n", h.name, err)
		return
	}
	h.running, h.done = c, make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		err := c.Wait()
		if err != nil {
			fmt.Fprintf(os.Stderr, "ortbus lease: %s hook: %v\n", h.name, err)
		}
		h.mu.Lock()
		h.running = nil
		h.mu.Unlock()
	}(h.done)
}

// stop ends a hook still running when the wrapper leaves, and waits for it.
func (h *leaseHook) stop() {
	h.mu.Lock()
	running, done := h.running, h.done
	h.mu.Unlock()
	if running != nil {
		running.Process.Kill()
		<-done
	}
}
