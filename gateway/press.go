package gateway

import (
	"log/slog"
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
//     reading of that device, which is also its foreign reading (foreign.go, read), so
//     that the memory the holder gave back stops counting as foreign at the same moment.
//     Other devices are not measurable: their pressed leases are never shrunk here
//     (pressing is false).
//  2. When: from the press (poke) every pressEvery while a lease is pressed (a holder's
//     pid may come with its next renew), and for pressSettle (lease.go) after each
//     shrink (the holder may still be freeing); nothing is measured when no lease is
//     either.
//  3. A measure below the lease's bytes shrinks it to that measure and ends the press
//     (shrinkPressed), whether the presser read it or the foreign readings' poll did;
//     the dispatch loop (a woken pool waits for that room: supervise.go) and the waiting
//     acquires are then woken (roomMade).
//
// presser owns the measures: its goroutine, and the pokes that start them. The leases it
// shrinks are the lease table's (lease.go), the readings of a device's processes the
// foreign memory's (foreign.go).
type presser struct {
	pokes    chan struct{} // the pressed leases to measure (cap 1: pokes coalesce)
	leases   *leases
	foreign  *foreignMem
	log      *slog.Logger
	roomMade func() // a lease shrunk: wakes the dispatch loop and the waiting acquires (wired by newBudget)
}

// pressEvery is how often a pressed lease's holder is measured (rule 2).
const pressEvery = 100 * time.Millisecond

func newPresser(l *leases, f *foreignMem, log *slog.Logger, roomMade func()) *presser {
	return &presser{pokes: make(chan struct{}, 1), leases: l, foreign: f, log: log, roomMade: roomMade}
}

// measurable reports whether a pressed lease on device can be measured here (rule 1).
func (p *presser) measurable(device string) bool {
	return device == "cpu" || p.foreign.readable(device)
}

// pressing reports whether a lease on device is pressed and its holder measurable here:
// the device is measurable (rule 1), and the holder gave a pid of this host (lease.go,
// rule 6). A pressed lease that is not is worth no wait: nothing here would shrink it.
func (p *presser) pressing(device string) bool {
	host, _ := os.Hostname()
	return p.measurable(device) && host != "" && p.leases.pressedHere(device, host, leaseNow())
}

// poke starts the measures of the pressed leases (rule 2); it never blocks.
func (p *presser) poke() {
	select {
	case p.pokes <- struct{}{}:
	default:
	}
}

// start runs the measures of the pressed leases, each under the configuration then in
// force (conf), until the returned stop is called.
func (p *presser) start(conf func() *config.Config) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				return
			case <-p.pokes:
			}
			tick := time.NewTicker(pressEvery)
			for p.measure(conf()) {
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

// measure measures the holders of the pressed (or settling) leases on this host once,
// each on its device (rule 1), under c; it reports whether one is still measured.
func (p *presser) measure(c *config.Config) bool {
	host, _ := os.Hostname()
	if host == "" {
		return false
	}
	for device, pids := range p.leases.measuredHolders(host, leaseNow()) {
		switch {
		case p.foreign.readable(device):
			p.foreign.read(c, device) // applied through fromReading
		case device == "cpu":
			tree := treeOf(childrenOf())
			p.shrunk(device, p.leases.shrinkPressed(device, host, rssOf(pids, tree), tree))
		}
	}
	return p.leases.anyMeasured(leaseNow())
}

// fromReading applies a reading of device's processes (foreign.go: its poll's or this
// presser's) to its measured leases (rule 3): a holder's processes are the pid its
// wrapper gave and their descendants on this host.
func (p *presser) fromReading(device string, usage map[int]int64) {
	host, _ := os.Hostname()
	if host == "" || !p.leases.measuredHere(device, host, leaseNow()) {
		return
	}
	p.shrunk(device, p.leases.shrinkPressed(device, host, usage, treeOf(childrenOf())))
}

// shrunk logs the leases of device a measure shrank, and wakes the dispatch loop and the
// waiting acquires when there are any (rule 3).
func (p *presser) shrunk(device string, leases []codec.LeaseReply) {
	for _, l := range leases {
		p.log.Info("pressed lease shrunk to its holder's measured usage", "device", device, "holder", l.Holder, "class", l.Class, "bytes", l.Bytes)
	}
	if len(leases) > 0 {
		p.roomMade()
	}
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

// childrenOf maps each pid of this host to its children, from /proc.
func childrenOf() map[int][]int {
	out := map[int][]int{}
	procs, err := procfs.AllProcs()
	if err != nil {
		return out
	}
	for _, p := range procs {
		st, err := p.Stat()
		if err == nil && st.PPID != p.PID {
			out[st.PPID] = append(out[st.PPID], p.PID)
		}
	}
	return out
}
