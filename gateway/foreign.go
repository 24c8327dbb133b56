package gateway

import (
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/procfs"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices"
)

// Foreign memory: what processes outside ortbus use on a device, measured per process
// where the device has a reader (devices.ProcessReader: nvidia-smi for cuda:N), shrinks
// the device's budget beside the admitted peaks and the leases.
//
//  1. The gateway reads every such device at start (before its workers, so their budget
//     knows it) and then every heartbeat interval; admission uses the latest reading.
//  2. A pid is ortbus's own, not foreign, when it is a worker process this gateway
//     supervises (and that has not exited), or the pid of a non-dead worker whose
//     heartbeat names this host (a remote pool's worker started by hand here). A
//     heartbeat's pid from another host says nothing of this host's pids (the same
//     number here is another process), so it is never taken as ours. What an ortbus
//     worker uses is counted by its models' peaks, not here; a worker of a pool this
//     gateway's config does not name (another gateway's, on the same GPU) is foreign
//     here, which is right: no admission of this gateway counts its memory otherwise.
//  3. Leases (lease.go) are held by processes outside ortbus, whose memory is thus in the
//     measured foreign usage too: the leases of a device cover up to their bytes of it,
//     so foreign = max(0, measured usage of non-ortbus pids − leased bytes), and budget −
//     admitted − leased − foreign is what is left (a lease is counted whole from its
//     grant, before its holder allocates; an allocation past it counts as foreign).
//  4. A reading that fails (nvidia-smi missing, timing out or printing what it should
//     not) is logged once (and once more when readings work again) and leaves the
//     device's foreign usage unknown: 0, as if no process outside ortbus used it.
type foreignMem struct {
	readers map[string]devices.ProcessReader // by device, only those with a reader

	reading sync.Mutex // one reading at a time (readForeign)
	mu      sync.Mutex
	bytes   map[string]int64 // device -> measured usage of non-ortbus pids, latest reading
	failing map[string]bool  // device -> its last reading failed
}

// newForeign gives every device a pool or a [devices] table of c names its reader, if any.
func newForeign(c *config.Config) *foreignMem {
	f := &foreignMem{readers: map[string]devices.ProcessReader{}, bytes: map[string]int64{}, failing: map[string]bool{}}
	for _, d := range deviceNames(c) {
		if r := devices.ProcessReaderFor(d); r != nil {
			f.readers[d] = r
		}
	}
	return f
}

// deviceNames are the devices the pools and the [devices] tables of c name, sorted.
func deviceNames(c *config.Config) []string {
	var out []string
	for d := range c.Devices {
		out = append(out, d)
	}
	for _, p := range c.Pools {
		out = append(out, p.Device)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// measured is the latest measured usage of processes outside ortbus on device (0 when
// unknown or unread).
func (f *foreignMem) measured(device string) int64 {
	if f == nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bytes[device]
}

// foreignBytes is what device's foreign usage takes from its budget beside leased bytes
// of leases (rule 3 here, rule 5 of lease.go).
func (b *budget) foreignBytes(device string, leased int64) int64 {
	return max(0, b.foreign.measured(device)-leased)
}

// pollForeign reads every device with a reader once; ortbus's own pids are c's (rule 2).
func (b *budget) pollForeign(c *config.Config) {
	f := b.foreign
	if f == nil || len(f.readers) == 0 {
		return
	}
	for _, d := range slices.Sorted(maps.Keys(f.readers)) {
		b.readForeign(c, d)
	}
}

// readForeign reads device d's processes (d has a reader) and applies the reading: the
// foreign usage, the pressed leases' shrink (lease.go, rule 6), and the waiting acquires
// woken when the usage drops (leasewait.go, rule 3). Readings run one at a time, so that
// an older one (the poll's) never lands after a fresher one (press.go's).
func (b *budget) readForeign(c *config.Config, d string) {
	f := b.foreign
	f.reading.Lock()
	defer f.reading.Unlock()
	usage, err := f.readers[d].ProcessMemory(d)
	ours := b.ourPIDs(c) // after the reading: a worker spawned meanwhile is ours
	f.mu.Lock()
	wasFailing, was := f.failing[d], f.bytes[d]
	f.failing[d] = err != nil
	if err != nil {
		delete(f.bytes, d)
	} else {
		var sum int64
		for pid, b := range usage {
			if !ours[pid] {
				sum += b
			}
		}
		f.bytes[d] = sum
	}
	dropped := f.bytes[d] < was
	f.mu.Unlock()
	if err == nil {
		b.reclaimFrom(d, usage)
	}
	if dropped {
		b.waits.wake()
	}
	switch {
	case err != nil && !wasFailing:
		b.log.Warn("cannot read the memory of the processes on a device; their usage is unknown and not counted", "device", d, "err", err)
	case err == nil && wasFailing:
		b.log.Info("reading the memory of the processes on a device again", "device", d)
	}
}

// startForeign reads the devices of c once now, then every heartbeat interval of c until
// the returned stop is called, each reading under the configuration then in force (conf).
func (b *budget) startForeign(c *config.Config, conf func() *config.Config) (stop func()) {
	b.foreign = newForeign(c)
	if len(b.foreign.readers) == 0 {
		return func() {}
	}
	b.pollForeign(c)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(c.Health.HeartbeatInterval.D())
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				b.pollForeign(conf())
			}
		}
	}()
	return func() { close(done); <-exited }
}

// ourPIDs are the pids of ortbus's own processes on this host (rule 2), the pools being
// c's.
func (b *budget) ourPIDs(c *config.Config) map[int]bool {
	ours := map[int]bool{}
	for _, pid := range b.pids() {
		ours[pid] = true
	}
	host, _ := os.Hostname()
	for _, w := range b.workers() {
		if !w.Dead && host != "" && w.HB.Host == host && w.HB.PID > 0 && c.Pools[w.HB.Pool] != nil {
			ours[w.HB.PID] = true
		}
	}
	return ours
}

// reclaimFrom applies a reading of device's processes to its pressed leases (lease.go,
// rule 6): a holder's processes are the pid its wrapper gave and their descendants on
// this host.
func (b *budget) reclaimFrom(device string, usage map[int]int64) {
	host, _ := os.Hostname()
	if host == "" || !b.leases.pressedHere(device, host) {
		return
	}
	b.shrunk(device, b.leases.shrinkPressed(device, host, usage, treeOf(childrenOf())))
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
