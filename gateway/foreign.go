package gateway

import (
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/devices"
	"github.com/ortbus/ortbus/health"
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
//
// foreignMem owns the devices' readers and their latest readings; what a reading means
// to the leases and the waiting acquires (press.go, leasewait.go) it hands on through
// the funcs its composer (budget.go) wires.
type foreignMem struct {
	// Wired once by the budget (newBudget).
	log     *slog.Logger
	workers func() []health.Worker                   // the tracker's workers, live and dead
	pids    func() []int                             // the supervised worker processes' pids
	onRead  func(device string, usage map[int]int64) // a reading that worked, pid -> bytes, applied under the reading's turn
	onDrop  func()                                   // a device's foreign usage dropped

	// readers are set by start, before any reading, and read-only after.
	readers map[string]devices.ProcessReader // by device, only those with a reader

	reading sync.Mutex // one reading at a time (read)
	mu      sync.Mutex
	bytes   map[string]int64 // device -> measured usage of non-ortbus pids, latest reading
	failing map[string]bool  // device -> its last reading failed
}

func newForeign(log *slog.Logger, workers func() []health.Worker, pids func() []int) *foreignMem {
	return &foreignMem{log: log, workers: workers, pids: pids, bytes: map[string]int64{}, failing: map[string]bool{},
		onRead: func(string, map[int]int64) {}, onDrop: func() {}}
}

// processReaders are the readers of the devices that a pool or a [devices] table of c
// names, for those that have one.
func processReaders(c *config.Config) map[string]devices.ProcessReader {
	out := map[string]devices.ProcessReader{}
	for _, d := range deviceNames(c) {
		if r := devices.ProcessReaderFor(d); r != nil {
			out[d] = r
		}
	}
	return out
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

// knownDevice reports whether device is named by a pool or a [devices] table of c.
func knownDevice(c *config.Config, device string) bool {
	return slices.Contains(deviceNames(c), device)
}

// readable reports whether device has a reader of its processes.
func (f *foreignMem) readable(device string) bool { return f.readers[device] != nil }

// latest is the latest measured usage of processes outside ortbus on device (0 when
// unknown or unread).
func (f *foreignMem) latest(device string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bytes[device]
}

// foreignPast is what a device's measured foreign usage takes from its budget beside
// leased bytes of leases (rule 3 here, rule 5 of lease.go).
func foreignPast(measured, leased int64) int64 { return max(0, measured-leased) }

// poll reads every device with a reader once; ortbus's own pids are c's (rule 2).
func (f *foreignMem) poll(c *config.Config) {
	for _, d := range slices.Sorted(maps.Keys(f.readers)) {
		f.read(c, d)
	}
}

// read reads device d's processes (d has a reader) and applies the reading: the foreign
// usage, onRead (the pressed leases' shrink: lease.go, rule 6), and onDrop when the
// usage drops (the waiting acquires woken: leasewait.go, rule 3). Readings run one at a
// time, so that an older one (the poll's) never lands after a fresher one (press.go's).
func (f *foreignMem) read(c *config.Config, d string) {
	f.reading.Lock()
	defer f.reading.Unlock()
	usage, err := f.readers[d].ProcessMemory(d)
	ours := f.ourPIDs(c) // after the reading: a worker spawned meanwhile is ours
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
		f.onRead(d, usage)
	}
	if dropped {
		f.onDrop()
	}
	switch {
	case err != nil && !wasFailing:
		f.log.Warn("cannot read the memory of the processes on a device; their usage is unknown and not counted", "device", d, "err", err)
	case err == nil && wasFailing:
		f.log.Info("reading the memory of the processes on a device again", "device", d)
	}
}

// start gives every device of c with a reader its reader, reads them once now, then
// every heartbeat interval of c until the returned stop is called, each reading under
// the configuration then in force (conf).
func (f *foreignMem) start(c *config.Config, conf func() *config.Config) (stop func()) {
	f.readers = processReaders(c)
	if len(f.readers) == 0 {
		return func() {}
	}
	f.poll(c)
	return every(c.Health.HeartbeatInterval.D(), func(time.Time) { f.poll(conf()) })
}

// ourPIDs are the pids of ortbus's own processes on this host (rule 2), the pools being
// c's.
func (f *foreignMem) ourPIDs(c *config.Config) map[int]bool {
	ours := map[int]bool{}
	for _, pid := range f.pids() {
		ours[pid] = true
	}
	host, _ := os.Hostname()
	for _, w := range f.workers() {
		if !w.Dead && host != "" && w.HB.Host == host && w.HB.PID > 0 && c.Pools[w.HB.Pool] != nil {
			ours[w.HB.PID] = true
		}
	}
	return ours
}
