package gateway

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/devices"
)

// Memory admission (admission.go), in process: capacities come from the config's
// [devices] entries, model peaks from the heartbeats fed to the tracker.

const mib = int64(1) << 20

// cudaBudget is cuda:0's budget below: ⌊1 GiB × 0.85⌋ bytes (870.4 MiB).
const cudaBudget = 912680550

// admissionConfig: pools a and b share cuda:0 (1 GiB, default safe fraction 0.85); c is
// on gpu.intel:0 (2 GiB, half of it safe); d is on gpu.intel:1, whose capacity is unknown
// (no [devices] entry, no reader): no admission there.
const admissionConfig = `
[nats]
url = "nats://127.0.0.1:1"
[security]
allowed_roots = ["/srv"]
[devices."cuda:0"]
capacity = "1GiB"
[devices."gpu.intel:0"]
capacity = "2GiB"
safe_fraction = 0.5
[devices.cpu]
safe_fraction = 0.5
[pools.a]
local = false
device = "cuda:0"
classes = ["interactive"]
models = ["tagger"]
[pools.b]
local = false
device = "cuda:0"
classes = ["batch"]
models = ["tagger"]
[pools.c]
local = false
device = "gpu.intel:0"
classes = ["interactive"]
models = ["tagger"]
[pools.d]
local = false
device = "gpu.intel:1"
classes = ["interactive"]
models = ["tagger"]
[models.tagger]
kind = "tagger-pixai"
dir = "/srv/m/tagger"
`

// peaks are model statuses with these peak sizes in MiB.
func peaks(mibs ...int64) []codec.ModelStatus {
	var out []codec.ModelStatus
	for i, m := range mibs {
		out = append(out, codec.ModelStatus{Name: string(rune('m' + i)), Loaded: true, PeakBytes: m * mib})
	}
	return out
}

// TestDeviceBudget: budget = capacity × safe fraction; the capacity is the config's, else
// read from the device (host memory for cpu); an unknown capacity says why, and admits
// nothing: a pool there is refused, naming the device and how to declare its capacity,
// and status says why.
func TestDeviceBudget(t *testing.T) {
	g := testGateway(t, admissionConfig)
	hostMem, _, err := devices.Capacity("cpu")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		device   string
		capacity int64
		fraction float64
		budget   int64
	}{
		{"cuda:0", 1 << 30, 0.85, cudaBudget},
		{"gpu.intel:0", 2 << 30, 0.5, 1 << 30},
		{"cpu", hostMem, 0.5, int64(float64(hostMem) * 0.5)},
		{"gpu.intel:1", 0, 0.85, 0},
	}
	for _, c := range cases {
		capacity, fraction, budget, why := deviceBudget(g.conf(), c.device)
		if capacity != c.capacity || fraction != c.fraction || budget != c.budget || (why == "") != (c.capacity > 0) {
			t.Errorf("deviceBudget(%s) = %d %v %d %q, want %d %v %d", c.device, capacity, fraction, budget, why, c.capacity, c.fraction, c.budget)
		}
	}
	if left, ok := g.budget.remaining(g.conf(), "gpu.intel:1", "", ""); ok || left != 0 {
		t.Errorf("remaining on a device of unknown capacity = %d %v, want no admission", left, ok)
	}
	e := g.budget.admissionError(g.conf(), "gpu.intel:1", "d", 0)
	if e == nil || e.Code != codec.CodeOverloaded || !strings.Contains(e.Message, "no capacity reading") || !strings.Contains(e.Message, "admits nothing") ||
		!strings.Contains(e.Message, `[devices."gpu.intel:1"] capacity`) || e.Details["device"] != "gpu.intel:1" {
		t.Errorf("a pool on a device of unknown capacity: %v, want refused naming the device and its capacity key", e)
	}
	for _, d := range g.budget.deviceStatus(g.conf()) {
		if (d.Device == "gpu.intel:1") != (d.CapacityError != "") || (d.CapacityError != "" && !strings.Contains(d.CapacityError, "no reader")) {
			t.Errorf("status of %s: capacity error %q", d.Device, d.CapacityError)
		}
	}
	if left, ok := g.budget.remaining(g.conf(), "cuda:0", "", ""); !ok || left != cudaBudget {
		t.Errorf("remaining on an empty cuda:0 = %d %v, want the whole budget", left, ok)
	}
}

// TestAdmitted: the admitted sum of a device is the model peaks of its live and starting
// workers, except the one named, not counting dead workers, other devices or workers of
// pools not in the config.
func TestAdmitted(t *testing.T) {
	g := testGateway(t, admissionConfig)
	f := newFleet(t, g)
	f.beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(100, 50)})
	f.beat(codec.Heartbeat{Worker: "b-0", Pool: "b", Slots: 1, Models: peaks(200), State: codec.StateStarting})
	f.beat(codec.Heartbeat{Worker: "c-0", Pool: "c", Slots: 1, Models: peaks(300)})
	f.beat(codec.Heartbeat{Worker: "x-0", Pool: "ghost", Slots: 1, Models: peaks(400)})

	for _, c := range []struct {
		device, except string
		want           int64
	}{
		{"cuda:0", "", 350 * mib},
		{"cuda:0", "a-0", 200 * mib},
		{"cuda:0", "b-0", 150 * mib},
		{"gpu.intel:0", "", 300 * mib},
		{"gpu.intel:1", "", 0},
	} {
		if got := g.budget.admission.admitted(g.conf(), c.device, c.except); got != c.want {
			t.Errorf("admitted(%s, except %q) = %d MiB, want %d MiB", c.device, c.except, got/mib, c.want/mib)
		}
	}
	budget := int64(cudaBudget)
	if left, ok := g.budget.remaining(g.conf(), "cuda:0", "", "b-0"); !ok || left != budget-150*mib {
		t.Errorf("remaining for b-0 = %d %v, want the budget less a-0's 150 MiB", left, ok)
	}
	g.tracker.MarkDead("b-0", "b", "", "exit code 1")
	if got := g.budget.admission.admitted(g.conf(), "cuda:0", ""); got != 150*mib {
		t.Errorf("admitted after b-0 died = %d MiB, want 150", got/mib)
	}
}

// TestAdmittedDeviceBytes: a worker whose process the driver reports holding more on its
// device than its models' peaks (a GPU EP's buffers grown past the warm-ups) is admitted
// at that measured figure; one that holds less still counts its peaks; a device_bytes
// without a source (not measured) counts nothing.
func TestAdmittedDeviceBytes(t *testing.T) {
	g := testGateway(t, admissionConfig)
	f := newFleet(t, g)
	f.beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(100), DeviceBytes: 250 * mib, DeviceSource: "nvidia-smi"})
	f.beat(codec.Heartbeat{Worker: "b-0", Pool: "b", Slots: 1, Models: peaks(200), DeviceBytes: 120 * mib, DeviceSource: "nvidia-smi"})
	f.beat(codec.Heartbeat{Worker: "c-0", Pool: "c", Slots: 1, Models: peaks(300), DeviceBytes: 900 * mib})
	if got := g.budget.admission.admitted(g.conf(), "cuda:0", ""); got != 450*mib {
		t.Errorf("admitted on cuda:0 = %d MiB, want 250 (a-0 measured) + 200 (b-0's peaks)", got/mib)
	}
	if got := g.budget.admission.admitted(g.conf(), "gpu.intel:0", ""); got != 300*mib {
		t.Errorf("admitted on gpu.intel:0 = %d MiB, want 300 (device_bytes without a source is not a measurement)", got/mib)
	}
	if left, ok := g.budget.remaining(g.conf(), "cuda:0", "a", ""); !ok || left != cudaBudget-450*mib {
		t.Errorf("remaining on cuda:0 = %d %v, want the budget less 450 MiB", left, ok)
	}
}

// TestAdmissionError: a refusal is overloaded and names the device, the pool, the sum
// that would be admitted and the budget (and capacity).
func TestAdmissionError(t *testing.T) {
	g := testGateway(t, admissionConfig)
	newFleet(t, g).beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(350)})
	budget := int64(cudaBudget)
	e := g.budget.admissionError(g.conf(), "cuda:0", "b", 600*mib)
	if e.Code != codec.CodeOverloaded {
		t.Fatalf("code %s, want overloaded", e.Code)
	}
	d := e.Details
	if d["device"] != "cuda:0" || d["pool"] != "b" || d["sum_bytes"] != 950*mib || d["budget_bytes"] != budget || d["capacity_bytes"] != int64(1<<30) {
		t.Fatalf("details %v", d)
	}
	for _, s := range []string{"pool b", "device cuda:0", "350.0MiB + 600.0MiB needed = 950.0MiB", "budget of 870.4MiB", "capacity 1024.0MiB x 0.85"} {
		if !strings.Contains(e.Message, s) {
			t.Errorf("message %q does not say %q", e.Message, s)
		}
	}
}

// TestDeviceStatus: every device a pool or a [devices] table names (cpu: only the
// latter, a device leases may use), sorted, with its budget, admitted sum, what is free
// (never negative) and its pools.
func TestDeviceStatus(t *testing.T) {
	g := testGateway(t, admissionConfig)
	f := newFleet(t, g)
	f.beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(100)})
	f.beat(codec.Heartbeat{Worker: "c-0", Pool: "c", Slots: 1, Models: peaks(1500)}) // over its 1 GiB budget
	st := g.budget.deviceStatus(g.conf())
	var names []string
	for _, d := range st {
		names = append(names, d.Device)
	}
	if !slices.Equal(names, []string{"cpu", "cuda:0", "gpu.intel:0", "gpu.intel:1"}) {
		t.Fatalf("devices %v", names)
	}
	if d := st[0]; len(d.Pools) != 0 || d.SafeFraction != 0.5 {
		t.Errorf("cpu (no pool) %+v", d)
	}
	st = st[1:]
	budget := int64(cudaBudget)
	if d := st[0]; d.BudgetBytes != budget || d.AdmittedBytes != 100*mib || d.FreeBytes != budget-100*mib || !slices.Equal(d.Pools, []string{"a", "b"}) {
		t.Errorf("cuda:0 %+v", d)
	}
	if d := st[1]; d.AdmittedBytes != 1500*mib || d.FreeBytes != 0 || d.SafeFraction != 0.5 {
		t.Errorf("gpu.intel:0 (over budget) %+v", d)
	}
	if d := st[2]; d.CapacityBytes != 0 || d.BudgetBytes != 0 || !slices.Equal(d.Pools, []string{"d"}) {
		t.Errorf("gpu.intel:1 (unknown capacity) %+v", d)
	}
}

// TestAdmissionRefusesBeforeStart: a local worker whose device budget is already spent
// is not started; its pool fails with the admission refusal, which a one-pool chain's
// requests then get.
func TestAdmissionRefusesBeforeStart(t *testing.T) {
	g := testGateway(t, admissionConfig)
	newFleet(t, g).beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(900)}) // past 870.4 MiB
	s := g.supervisor
	s.bin = filepath.Join(t.TempDir(), "no-such-ortworker") // never a real process, whatever happens
	s.pools["b"] = &poolProcs{cfg: g.conf().Pools["b"]}
	p := &proc{pool: "b"}
	s.pools["b"].procs = []*proc{p}
	s.spawn(p)
	if p.cmd != nil {
		t.Fatal("a worker was started with its device's budget spent")
	}
	select {
	case <-p.settled:
	default:
		t.Fatal("the refused worker is not settled")
	}
	failed := s.pools["b"].failed
	if failed == nil || failed.Code != codec.CodeOverloaded || failed.Details["device"] != "cuda:0" || failed.Details["pool"] != "b" {
		t.Fatalf("pool b failed with %v, want the admission refusal", failed)
	}
	_, err := routeIn(g.d.snapshot(time.Now(), g.d.lc.held()), newItem("batch", "tag", soon(), "b"), nil)
	if e := asErr(err); e.Code != codec.CodeOverloaded || e.Details["device"] != "cuda:0" {
		t.Fatalf("request to the refused pool: %v, want its overloaded refusal", err)
	}
}
