package gateway

import (
	"os"
	"slices"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// Pressed leases measured: while a reclaimable lease is pressed (lease.go, rule 6), the
// gateway measures its holder every pressEvery from a fresh reading, so that the lease
// shrinks (and the acquires waiting for its room are granted: leasewait.go) within
// pressEvery of the holder's memory being free, not at the next foreign reading.
//
//  1. What is measured: the holder's processes (the pid its wrapper gave and their
//     descendants, on this gateway's host only), on the lease's device: on cpu their
//     resident memory (RSS, /proc/PID/stat); on a device with a reader of its processes'
//     memory (devices.ProcessReader: nvidia-smi for cuda:N, the DRM fdinfo for drm:N), a
//     reading of that device, which is also its foreign reading (foreign.go,
//     readForeign), so that the memory the holder gave back stops counting as foreign
//     at the same moment. Other devices are not measurable: their pressed leases are
//     never shrunk here (pressing is false).
//  2. When: from the press (pokePresser) every pressEvery while a lease is pressed (a
//     holder's pid may come with its next renew), and for pressSettle after each shrink
//     (the holder may still be freeing); nothing is measured when no lease is either.
//  3. A measure below the lease's bytes shrinks it to that measure and ends the press
//     (shrinkPressed); the dispatch loop (a woken pool waits for that room: supervise.go)
//     and the waiting acquires are then woken.
const (
	pressEvery  = 100 * time.Millisecond
	pressSettle = time.Second
)

// measured reports whether x's holder is measured at now (rules 2, 3): x is pressed, or
// settling.
func (x *lease) measured(now time.Time) bool {
	return (!x.pressedAt.IsZero() && now.Sub(x.pressedAt) < pressFor) || x.settling(now)
}

// settling reports whether x was shrunk within pressSettle of now: measured on, not
// pressed again (lease.go, rule 6).
func (x *lease) settling(now time.Time) bool {
	return !x.shrunkAt.IsZero() && now.Sub(x.shrunkAt) < pressSettle
}

// measurable reports whether a pressed lease on device can be measured here (rule 1).
func (b *budget) measurable(device string) bool {
	return device == "cpu" || (b.foreign != nil && b.foreign.readers[device] != nil)
}

// pokePresser starts the measures of the pressed leases (rule 2); it never blocks.
func (b *budget) pokePresser() {
	select {
	case b.presses <- struct{}{}:
	default:
	}
}

// startPresser runs the measures of the pressed leases, each under the configuration then
// in force (conf), until the returned stop is called.
func (b *budget) startPresser(conf func() *config.Config) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				return
			case <-b.presses:
			}
			tick := time.NewTicker(pressEvery)
			for b.measurePressed(conf()) {
				select {
				case <-done:
					tick.Stop()
					return
				case <-tick.C:
				}
			}
			tick.Stop()
		}
	}()
	return func() { close(done); <-exited }
}

// measurePressed measures the holders of the pressed (or settling) leases on this host
// once, each on its device (rule 1), under c; it reports whether one is still measured.
func (b *budget) measurePressed(c *config.Config) bool {
	host, _ := os.Hostname()
	if host == "" {
		return false
	}
	for device, pids := range b.leases.pressedHolders(host, leaseNow()) {
		switch {
		case b.foreign != nil && b.foreign.readers[device] != nil:
			b.readForeign(c, device)
		case device == "cpu":
			tree := treeOf(childrenOf())
			b.shrunk(device, b.leases.shrinkPressed(device, host, rssOf(pids, tree), tree))
		}
	}
	return b.leases.anyPressed(leaseNow())
}

// pressedHolders maps each device with a measured lease (pressed or settling) whose
// holder is on host to those holders' pids, at now.
func (l *leases) pressedHolders(host string, now time.Time) map[string][]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]int{}
	for _, x := range l.by {
		if x.measured(now) && x.pid > 0 && x.host == host {
			out[x.Device] = append(out[x.Device], x.pid)
		}
	}
	return out
}

// anyPressed reports whether a lease is measured (pressed or settling) at now.
func (l *leases) anyPressed(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.by {
		if x.measured(now) {
			return true
		}
	}
	return false
}

// rssOf is the resident memory of each process of the trees of pids (0 for one that is
// gone), read now from /proc.
func rssOf(pids []int, tree func(int) []int) map[int]int64 {
	out := map[int]int64{}
	for _, root := range pids {
		for _, pid := range tree(root) {
			if _, ok := out[pid]; ok {
				continue
			}
			out[pid] = 0
			if p, err := procfs.NewProc(pid); err == nil {
				if st, err := p.Stat(); err == nil {
					out[pid] = int64(st.ResidentMemory())
				}
			}
		}
	}
	return out
}

// maxTree bounds the processes of one holder's tree.
const maxTree = 4096

// treeOf is, for a map of each pid to its children, the pid and its descendants (at most
// maxTree).
func treeOf(kids map[int][]int) func(pid int) []int {
	return func(pid int) []int {
		out := []int{pid}
		for i := 0; i < len(out) && len(out) < maxTree; i++ {
			out = append(out, kids[out[i]]...)
		}
		return slices.Clip(out[:min(len(out), maxTree)])
	}
}

// shrunk logs the leases of device a measure shrank (shrinkPressed), and wakes the
// dispatch loop and the waiting acquires when there are any (rule 3).
func (b *budget) shrunk(device string, leases []codec.LeaseReply) {
	for _, l := range leases {
		b.log.Info("pressed lease shrunk to its holder's measured usage", "device", device, "holder", l.Holder, "class", l.Class, "bytes", l.Bytes)
	}
	if len(leases) > 0 {
		b.kick() // a waiting pool may fit now
		b.waits.wake()
	}
}
