package gateway

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// Pressed leases measured (press.go), in process: a real holder process (sleep, a few
// hundred KiB resident) on cpu, and a fake reader of cuda:0's processes; the waiting
// leases' runner and the presser started as the gateway starts them.

// holderProc starts a process that holds a lease in the tests (it uses next to nothing)
// and stops it when t ends.
func holderProc(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

// reclaimable acquires a batch lease of bytes on device that gives memory back on demand,
// held by pid on this host.
func reclaimable(t *testing.T, g *Gateway, device string, bytes int64, pid int) *codec.LeaseReply {
	t.Helper()
	host, _ := os.Hostname()
	l, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: device, Bytes: bytes, Class: "batch", TTLMS: 600000, Holder: "holder", Reclaim: true, PID: pid, Host: host})
	if e != nil {
		t.Fatal(e)
	}
	return l
}

// leaseOn is the lease of holder on device in status.
func leaseOn(t *testing.T, g *Gateway, device, holder string) codec.LeaseReply {
	t.Helper()
	for _, d := range g.budget.deviceStatus(g.conf()) {
		for _, l := range d.Leases {
			if d.Device == device && l.Holder == holder {
				return l
			}
		}
	}
	t.Fatalf("no lease of %s on %s", holder, device)
	return codec.LeaseReply{}
}

// Rules 1 to 3 on cpu: an urgent acquire waiting behind a reclaimable lease presses it;
// the presser measures the holder's resident memory, below the lease's bytes, shrinks the
// lease to it, and the waiter is granted.
func TestPressShrinksOnCPU(t *testing.T) {
	g := testGateway(t, admissionConfig)
	t.Cleanup(g.budget.startWaits(g.conf))
	t.Cleanup(g.budget.presser.start(g.conf))
	_, _, budget, _ := deviceBudget(g.conf(), "cpu")
	pid := holderProc(t)
	reclaimable(t, g, "cpu", budget-10*mib, pid)
	r := newWaitRecorder(g)
	r.send("urgent", "", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cpu", Bytes: 100 * mib, Class: "urgent", TTLMS: 600000, WaitMS: 60000})
	if a := r.next(t); a.e != nil {
		t.Fatalf("the urgent waiter: %v, want granted once the holder is measured", a.e)
	}
	l := leaseOn(t, g, "cpu", "holder")
	rss := rssOf([]int{pid}, func(p int) []int { return []int{p} })[pid]
	if l.Pressed || l.Bytes >= 10*mib || rss <= 0 {
		t.Errorf("the reclaimable lease: %+v (holder's resident memory %d), want shrunk to its holder's few KiB, pressed no more", l, rss)
	}
	if h := g.budget.leases.gated(time.Now())["cpu"]; len(h.tags) != 0 {
		t.Errorf("the lease still in the gate's pressed tags after its shrink: %v", h.tags)
	}
}

// countingProcs is fakeProcs that counts its readings.
type countingProcs struct {
	fakeProcs
	n atomic.Int64
}

func (c *countingProcs) ProcessMemory(d string) (map[int]int64, error) {
	c.n.Add(1)
	return c.fakeProcs.ProcessMemory(d)
}

// Rules 1 to 3 on a GPU: the presser reads the device's processes while the lease is
// pressed (the foreign readings' poll does not run here); the reading that shows the
// holder's memory given back shrinks the lease and updates the foreign usage at once, and
// the waiter is granted.
func TestPressReadsDevice(t *testing.T) {
	g, _, _, _ := foreignGateway(t)
	fake := &countingProcs{}
	g.budget.foreign.readers["cuda:0"] = fake
	pid := holderProc(t)
	reclaimable(t, g, "cuda:0", 800*mib, pid) // acquired before its holder allocates (lease.go, rule 5)
	fake.set(map[int]int64{pid: 800 * mib, 4_000_001: 20 * mib}, nil)
	g.budget.foreign.poll(g.conf())
	if st := cudaStatus(t, g); st.ForeignBytes != 20*mib {
		t.Fatalf("cuda:0 before the press: %+v, want 20 MiB foreign", st)
	}
	t.Cleanup(g.budget.startWaits(g.conf))
	t.Cleanup(g.budget.presser.start(g.conf))
	r := newWaitRecorder(g)
	r.send("urgent", "", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 100 * mib, Class: "urgent", TTLMS: 600000, WaitMS: 60000})
	if n := len(r.answers()); n != 0 {
		t.Fatalf("answered before the holder gave its memory back: %v", r.answers())
	}
	fake.set(map[int]int64{pid: 30 * mib, 4_000_001: 20 * mib}, nil)
	if a := r.next(t); a.e != nil {
		t.Fatalf("the urgent waiter: %v, want granted", a.e)
	}
	if l := leaseOn(t, g, "cuda:0", "holder"); l.Bytes != 30*mib || l.Pressed {
		t.Errorf("the reclaimable lease: %+v, want shrunk to the 30 MiB read", l)
	}
	// 50 MiB read, all covered by 130 MiB of leases: nothing foreign (a reading before
	// the press would leave 820 - 130 = 690 MiB foreign).
	if st := cudaStatus(t, g); st.ForeignBytes != 0 || st.LeasedBytes != 130*mib {
		t.Errorf("cuda:0 after: %+v, want leased 130 MiB, nothing foreign", st)
	}
	if fake.n.Load() < 2 {
		t.Errorf("%d readings, want the presser's beside the poll's", fake.n.Load())
	}
}

// treeOf: a pid and its descendants, bounded; rssOf: a live process's resident memory,
// 0 for one that is gone.
func TestTreeAndRSS(t *testing.T) {
	tree := treeOf(map[int][]int{1: {2, 3}, 2: {4}, 9: {10}})
	if got := tree(1); !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Errorf("tree(1) = %v", got)
	}
	if got := tree(5); !slices.Equal(got, []int{5}) {
		t.Errorf("tree(5) = %v", got)
	}
	chain := map[int][]int{}
	for i := range 2 * maxTree {
		chain[i] = []int{i + 1}
	}
	if n := len(treeOf(chain)(0)); n != maxTree {
		t.Errorf("a chain's tree has %d pids, want the bound %d", n, maxTree)
	}
	self := os.Getpid()
	if rss := rssOf([]int{self}, func(p int) []int { return []int{p, 1 << 30} }); rss[self] <= 0 || rss[1<<30] != 0 {
		t.Errorf("rss %v, want this process's > 0 and none for a pid that is no process", rss)
	}
}

// Rule 3 and lease.go's rule 6 on a holder that frees in steps: the first measure below
// the lease shrinks it (to 600 MiB: the urgent 300 MiB still does not fit) and ends the
// press; the waiting acquire's next try does not press it again (its hook ran once), and
// the measures go on: the next drop shrinks it to 100 MiB and the waiter is granted.
func TestPressSettles(t *testing.T) {
	g, _, _, _ := foreignGateway(t)
	pid := holderProc(t)
	reclaimable(t, g, "cuda:0", 800*mib, pid)
	fake := g.budget.foreign.readers["cuda:0"].(*fakeProcs)
	fake.set(map[int]int64{pid: 800 * mib}, nil)
	g.budget.foreign.poll(g.conf())
	t.Cleanup(g.budget.startWaits(g.conf))
	t.Cleanup(g.budget.presser.start(g.conf))
	r := newWaitRecorder(g)
	r.send("urgent", "", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 300 * mib, Class: "urgent", TTLMS: 600000, WaitMS: 60000})
	fake.set(map[int]int64{pid: 600 * mib}, nil)
	// A pass of the waiters after the shrink: its refusal counts the lease at 600 MiB.
	checkFor(t, "a try of the waiter after the shrink", 30*time.Second, 5*time.Millisecond, func() error {
		w := g.budget.waits
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.q) != 1 || w.q[0].last.Details["leased_bytes"] != 600*mib {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if h := g.budget.leases.gated(time.Now())["cuda:0"]; len(h.tags) != 0 {
		t.Fatalf("pressed again after its first shrink: %v", h.tags)
	}
	fake.set(map[int]int64{pid: 100 * mib}, nil)
	if a := r.next(t); a.e != nil {
		t.Fatalf("the urgent waiter: %v, want granted", a.e)
	}
	if l := leaseOn(t, g, "cuda:0", "holder"); l.Bytes != 100*mib {
		t.Errorf("the reclaimable lease: %+v, want shrunk again to 100 MiB", l)
	}
}
