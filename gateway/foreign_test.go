package gateway

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/devices"
)

// Foreign memory (foreign.go), in process: the admissionConfig's cuda:0 (1 GiB × 0.85)
// read through a fake devices.ProcessReader, its workers fed to the tracker.

// fakeProcs is a devices.ProcessReader answering by, or err.
var _ devices.ProcessReader = (*fakeProcs)(nil)

type fakeProcs struct {
	mu  sync.Mutex
	by  map[int]int64
	err error
}

func (f *fakeProcs) ProcessMemory(string) (map[int]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.by, f.err
}

func (f *fakeProcs) set(by map[int]int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.by, f.err = by, err
}

// foreignGateway is testGateway on admissionConfig with fake readers of cuda:0 and its
// log kept in the returned buffer.
func foreignGateway(t *testing.T) (*Gateway, *fleet, *fakeProcs, *bytes.Buffer) {
	t.Helper()
	g := testGateway(t, admissionConfig)
	var log bytes.Buffer
	g.log = slog.New(slog.NewTextHandler(&log, nil))
	g.budget.foreign.log = g.log
	f := newFleet(t, g)
	readers := processReaders(g.conf())
	if _, ok := readers["cuda:0"]; !ok || len(readers) != 1 {
		t.Fatalf("readers %v, want cuda:0's only", readers)
	}
	fake := &fakeProcs{}
	readers["cuda:0"] = fake
	g.budget.foreign.readers = readers
	return g, f, fake, &log
}

func cudaStatus(t *testing.T, g *Gateway) codec.DeviceStatus {
	t.Helper()
	for _, d := range g.budget.deviceStatus(g.conf()) {
		if d.Device == "cuda:0" {
			return d
		}
	}
	t.Fatal("no cuda:0 in status")
	return codec.DeviceStatus{}
}

// TestForeignAdmission: the memory of pids that are not ortbus's own shrinks the budget
// (rule 2: own = supervised workers and this host's heartbeating workers of its pools, never a pid
// another host's worker reports), leases cover it up to their bytes (rule 3), and it is
// in status, in a refused lease's figures and in a refused pool's.
func TestForeignAdmission(t *testing.T) {
	g, f, fake, _ := foreignGateway(t)
	host, _ := os.Hostname()
	f.beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Host: host, PID: 1001, Slots: 1, Models: peaks(300)})
	f.beat(codec.Heartbeat{Worker: "b-0", Pool: "b", Host: "elsewhere", PID: 1002, Slots: 1, Models: peaks(100)})
	// A worker here of a pool this gateway's config does not name (another gateway's).
	f.beat(codec.Heartbeat{Worker: "x-0", Pool: "ghost", Host: host, PID: 1005, Slots: 1, Models: peaks(10)})
	// A supervised worker that has not heartbeaten yet.
	g.supervisor.pools["s"] = &poolProcs{procs: []*proc{{cmd: &exec.Cmd{Process: &os.Process{Pid: 1004}}, exited: make(chan struct{})}}}
	if ours := g.budget.foreign.ourPIDs(g.conf()); !reflect.DeepEqual(ours, map[int]bool{1001: true, 1004: true}) {
		t.Errorf("our pids %v, want 1001 (this host's worker) and 1004 (supervised)", ours)
	}

	// Nothing read yet: nothing foreign.
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "", ""); left != cudaBudget-400*mib {
		t.Fatalf("remaining before any reading = %d MiB", left/mib)
	}
	fake.set(map[int]int64{1001: 380 * mib, 1002: 50 * mib, 1003: 150 * mib, 1004: 70 * mib}, nil)
	g.budget.foreign.poll(g.conf())
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "", ""); left != cudaBudget-600*mib {
		t.Errorf("remaining with 200 MiB foreign (pid 1002 is another host's worker: here it is foreign) = budget - %d MiB, want budget - 600 MiB", (cudaBudget-left)/mib)
	}
	st := cudaStatus(t, g)
	if st.ForeignBytes != 200*mib || st.FreeBytes != cudaBudget-600*mib || st.AdmittedBytes != 400*mib {
		t.Errorf("status %+v, want foreign 200 MiB and free budget - 600 MiB", st)
	}

	// A lease covers its holder's usage: granted, it takes the foreign bytes it covers.
	now := time.Now()
	leaseNow = func() time.Time { return now }
	t.Cleanup(func() { leaseNow = time.Now })
	l, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 150 * mib, TTLMS: 60000})
	if e != nil {
		t.Fatalf("a lease that fits: %v", e)
	}
	if st := cudaStatus(t, g); st.LeasedBytes != 150*mib || st.ForeignBytes != 50*mib || st.FreeBytes != cudaBudget-600*mib {
		t.Errorf("status with the lease %+v, want leased 150, foreign 50, free unchanged", st)
	}
	// One that would pass the budget is refused with the foreign bytes in its figures.
	_, e = leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 300 * mib})
	if e == nil || e.Code != codec.CodeOverloaded || e.Details["foreign_bytes"] != 50*mib || e.Details["sum_bytes"] != 900*mib ||
		e.Details["leased_bytes"] != 150*mib || e.Details["admitted_bytes"] != 400*mib || !strings.Contains(e.Message, "foreign 50.0MiB") {
		t.Errorf("lease past the budget: %v %v, want overloaded with foreign 50 MiB, sum 900 MiB", e, e.Details)
	}
	// A lease larger than its holder's usage leaves nothing foreign, never less than 0.
	leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRelease, Lease: l.Lease})
	leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 250 * mib, TTLMS: 60000})
	if st := cudaStatus(t, g); st.ForeignBytes != 0 || st.FreeBytes != cudaBudget-650*mib {
		t.Errorf("status with a lease past the foreign usage %+v, want foreign 0, free budget - 650 MiB", st)
	}
	if e := g.budget.admissionError(g.conf(), "cuda:0", "a", 300*mib); e.Details["foreign_bytes"] != nil || !strings.Contains(e.Message, "leases 250.0MiB") {
		t.Errorf("refusal without foreign bytes: %v %v", e, e.Details)
	}
	now = now.Add(time.Hour) // the lease expires

	// A worker judged dead is not ours any more: its memory is no model peak now, so it
	// counts as foreign. A supervised worker that exited is not ours either.
	g.tracker.MarkDead("a-0", "a", "", "test")
	close(g.supervisor.pools["s"].procs[0].exited)
	g.budget.foreign.poll(g.conf())
	st = cudaStatus(t, g)
	if st.ForeignBytes != 650*mib || st.AdmittedBytes != 100*mib || st.FreeBytes != cudaBudget-750*mib {
		t.Errorf("status after a-0 died and s-0 exited %+v, want foreign 650 MiB", st)
	}
	e = g.budget.admissionError(g.conf(), "cuda:0", "a", 300*mib)
	if e.Details["foreign_bytes"] != 650*mib || e.Details["sum_bytes"] != 1050*mib || !strings.Contains(e.Message, "foreign processes 650.0MiB") {
		t.Errorf("a pool's refusal %v %v, want foreign 650 MiB in its figures", e, e.Details)
	}
}

// TestForeignReadingFails: a reading that fails leaves the foreign usage unknown (none
// counted), is logged once however often it fails, and once more when it works again.
func TestForeignReadingFails(t *testing.T) {
	g, _, fake, log := foreignGateway(t)
	fake.set(map[int]int64{7: 100 * mib}, nil)
	g.budget.foreign.poll(g.conf())
	if st := cudaStatus(t, g); st.ForeignBytes != 100*mib {
		t.Fatalf("status %+v, want foreign 100 MiB", st)
	}
	fake.set(nil, errors.New("nvidia-smi: executable file not found"))
	for range 3 {
		g.budget.foreign.poll(g.conf())
	}
	if st := cudaStatus(t, g); st.ForeignBytes != 0 || st.FreeBytes != cudaBudget {
		t.Errorf("status after failed readings %+v, want nothing foreign", st)
	}
	if n := strings.Count(log.String(), "cannot read the memory"); n != 1 {
		t.Errorf("failure logged %d times, want once:\n%s", n, log)
	}
	fake.set(map[int]int64{7: 10 * mib}, nil)
	g.budget.foreign.poll(g.conf())
	g.budget.foreign.poll(g.conf())
	if st := cudaStatus(t, g); st.ForeignBytes != 10*mib {
		t.Errorf("status after recovery %+v", st)
	}
	if n := strings.Count(log.String(), "reading the memory of the processes on a device again"); n != 1 {
		t.Errorf("recovery logged %d times, want once:\n%s", n, log)
	}
}
