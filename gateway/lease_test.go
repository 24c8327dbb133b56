package gateway

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// Leases (lease.go), in process: the admissionConfig's cuda:0 (1 GiB × 0.85), its
// workers fed to the tracker, the leases' clock moved by the test.

// Rule 4 in status: an account sees its own leases, holders and ids; another account's only
// in the device's figures; the local owner sees every lease, without ids.
func TestLeaseStatusOwners(t *testing.T) {
	g := testGateway(t, admissionConfig)
	acquire := func(account, holder string) *codec.LeaseReply {
		l, e := leaseAs(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 10 * mib, Class: "batch", Holder: holder, TTLMS: 60_000}, account)
		if e != nil {
			t.Fatal(e)
		}
		return l
	}
	a := acquire("account:A", "a-holder")
	acquire("account:B", "b-holder")
	acquire("", "op-holder")
	view := func(account string) (int64, []string) {
		for _, d := range g.status(account).Devices {
			if d.Device == "cuda:0" {
				var seen []string
				for _, l := range d.Leases {
					seen = append(seen, l.Holder+"/"+l.Lease)
				}
				slices.Sort(seen)
				return d.LeasedBytes, seen
			}
		}
		t.Fatal("no cuda:0 in status")
		return 0, nil
	}
	for account, want := range map[string][]string{
		"account:A": {"a-holder/" + a.Lease},
		"account:C": nil,
		"":          {"a-holder/", "b-holder/", "op-holder/"},
	} {
		leased, seen := view(account)
		if !slices.Equal(seen, want) {
			t.Errorf("%q's status lists the leases %v, want %v", account, seen, want)
		}
		if leased != 30*mib {
			t.Errorf("%q's status: leased %d MiB, want every lease's 30", account, leased/mib)
		}
	}
}

func TestLeaseAdmission(t *testing.T) {
	g := testGateway(t, admissionConfig)
	f := newFleet(t, g)
	f.beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(300)})
	now := time.Now()
	leaseNow = func() time.Time { return now }
	t.Cleanup(func() { leaseNow = time.Now })

	// Rule 1: more than the budget left is refused with the figures.
	_, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 600 * mib, Class: "interactive", TTLMS: 1000})
	if e == nil || e.Code != codec.CodeOverloaded || e.Details["sum_bytes"] != int64(900*mib) || e.Details["budget_bytes"] != int64(cudaBudget) || e.Details["device"] != "cuda:0" {
		t.Fatalf("lease over the budget: %v %v, want overloaded with device, sum 900 MiB and budget", e, e.Details)
	}
	l, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 500 * mib, Class: "interactive", TTLMS: 1000, Holder: "llama"})
	if e != nil || l.Lease == "" || l.ExpiresUnixMS != now.Add(time.Second).UnixMilli() {
		t.Fatalf("lease within the budget: %+v %v", l, e)
	}
	// It counts in the admission of pools and of other leases, and shows in status
	// without its id.
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "", ""); left != cudaBudget-800*mib {
		t.Errorf("remaining with the lease = %d MiB, want budget - 800 MiB", left/mib)
	}
	if _, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 100 * mib}); e == nil || e.Code != codec.CodeOverloaded {
		t.Errorf("a second lease past the budget: %v, want overloaded", e)
	}
	var st codec.DeviceStatus
	for _, d := range g.budget.deviceStatus(g.conf()) {
		if d.Device == "cuda:0" {
			st = d
		}
	}
	if st.LeasedBytes != 500*mib || len(st.Leases) != 1 || st.Leases[0].Lease != "" || st.Leases[0].Holder != "llama" || st.FreeBytes != cudaBudget-800*mib {
		t.Errorf("status of cuda:0: %+v", st)
	}
	// Rule 2: renewed, it lives on; not renewed, it is gone after its ttl.
	now = now.Add(900 * time.Millisecond)
	if r, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: l.Lease, TTLMS: 1000}); e != nil || r.ExpiresUnixMS != now.Add(time.Second).UnixMilli() {
		t.Fatalf("renew: %+v %v", r, e)
	}
	now = now.Add(999 * time.Millisecond)
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "", ""); left != cudaBudget-800*mib {
		t.Errorf("before the renewed expiry: remaining %d MiB", left/mib)
	}
	now = now.Add(time.Millisecond)
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "", ""); left != cudaBudget-300*mib {
		t.Errorf("after expiry: remaining %d MiB, want the lease's bytes back", left/mib)
	}
	if _, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: l.Lease}); e == nil || e.Code != codec.CodeBadRequest {
		t.Errorf("renew of an expired lease: %v, want bad_request", e)
	}
	// Release gives the bytes back at once.
	l2, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 500 * mib, TTLMS: 60000})
	if e != nil {
		t.Fatal(e)
	}
	if r, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseRelease, Lease: l2.Lease}); e != nil || !r.Released {
		t.Fatalf("release: %+v %v", r, e)
	}
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "", ""); left != cudaBudget-300*mib {
		t.Errorf("after release: remaining %d MiB", left/mib)
	}
	// A ttl past lease_max_ttl is cut to it; bad requests are refused.
	l3, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: mib, TTLMS: 1 << 50})
	if e != nil || l3.ExpiresUnixMS != now.Add(g.conf().Gateway.LeaseMaxTTL.D()).UnixMilli() {
		t.Errorf("huge ttl: %+v %v, want lease_max_ttl", l3, e)
	}
	for _, bad := range []codec.LeaseRequest{
		{Action: "steal"},
		{Action: codec.LeaseAcquire, Device: "cuda:0"},
		{Action: codec.LeaseAcquire, Device: "nowhere:0", Bytes: 1},
		{Action: codec.LeaseAcquire, Device: "gpu.intel:1", Bytes: 1}, // capacity unknown
		{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 1, Class: "nope"},
		{Action: codec.LeaseRenew, Lease: "a.b"},
		{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 1 << 62},
	} {
		if _, e := leaseOwn(g, &bad); e == nil {
			t.Errorf("%+v: granted, want refused", bad)
		}
	}
}

// Rule 3: an interactive lease on a device holds batch there to one unit, as queued or
// running interactive work does.
func TestLeaseHoldsBatchToOneUnit(t *testing.T) {
	c := snapOf(t, admissionConfig)
	c.load.add("cuda:0", "batch", 1)
	if !c.shareAllows("b", "batch", nil) {
		t.Fatal("batch refused a second unit with no higher class on the device")
	}
	c.leased.add("cuda:0", "interactive", 1)
	if c.shareAllows("b", "batch", nil) {
		t.Error("batch took a second unit while an interactive lease is held on its device")
	}
	c.leased = classCounts{}
	c.leased.add("cuda:0", "batch", 1)
	if !c.shareAllows("b", "batch", nil) {
		t.Error("a batch lease held batch to one unit")
	}
}

// Reservations (admission.go): interactive's reservation on cuda:0 is not batch's to use,
// in pool admission and in leases alike; interactive's own workers fill it first.
func TestReservation(t *testing.T) {
	g := testGateway(t, admissionConfig+`
[devices."cuda:0".reserve]
interactive = "400MiB"
`)
	f := newFleet(t, g)
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "b", ""); left != cudaBudget-400*mib {
		t.Errorf("batch pool b's budget = %d MiB, want the budget less the reservation", left/mib)
	}
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "a", ""); left != cudaBudget {
		t.Errorf("interactive pool a's budget = %d MiB, want the whole budget", left/mib)
	}
	f.beat(codec.Heartbeat{Worker: "a-0", Pool: "a", Slots: 1, Models: peaks(300)})
	if left, _ := g.budget.remaining(g.conf(), "cuda:0", "b", ""); left != cudaBudget-400*mib {
		t.Errorf("with a-0's 300 MiB in the reservation, b's budget = %d MiB, want budget - 400 MiB", left/mib)
	}
	// 570.4 MiB left in all, 100 MiB of it still reserved: 500 MiB is too much for a batch
	// lease, not for an interactive one.
	if _, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 500 * mib, Class: "batch"}); e == nil || e.Code != codec.CodeOverloaded {
		t.Errorf("a batch lease into interactive's reservation: %v, want overloaded", e)
	}
	if _, e := leaseOwn(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 500 * mib, Class: "interactive"}); e != nil {
		t.Errorf("an interactive lease of what is left: %v", e)
	}
	if e := g.budget.admissionError(g.conf(), "cuda:0", "b", 10*mib); !strings.Contains(e.Message, "reserved for higher classes") {
		t.Errorf("refusal of b: %q does not name the reservation", e.Message)
	}
}
