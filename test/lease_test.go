package test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// TestLease: memory leases (gateway/lease.go) on a real gateway whose cpu device has a
// declared capacity, asked as JSON the way `nats req ortbus.v1.lease` does, and the
// `ortbus lease` wrapper.
func TestLease(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	g := startGateway(t, gwConfig{
		Root:    root,
		Devices: map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5}}, // budget 512 MiB
		Pools:   []gwPool{{Name: "p", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"interactive", "batch"}, Models: []string{gwTagger}}},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"p"}}, {Name: "batch", Chain: []string{"p"}}},
	}.write(t))
	g.waitLive(t, "p", 1)
	req := func(body string) (codec.LeaseReply, *codec.Error) { return leaseReq(t, g, body) }
	cpu := func() codec.DeviceStatus { return deviceOf(t, g, "cpu") }
	budget := cpu().BudgetBytes
	if budget != 512<<20 {
		t.Fatalf("cpu budget %d, want 512 MiB", budget)
	}

	// More than the budget left: overloaded, with the figures.
	_, e := req(`{"action":"acquire","device":"cpu","bytes":600000000,"class":"interactive","ttl_ms":500,"holder":"llm"}`)
	if e == nil || e.Code != codec.CodeOverloaded || e.Details["device"] != "cpu" || e.Details["budget_bytes"] == nil || e.Details["sum_bytes"] == nil {
		t.Fatalf("lease over the budget: %v (details %v), want overloaded naming device, sum and budget", e, e.Details)
	}
	// A smaller one is granted and shows in status (without its id).
	l, e := req(`{"action":"acquire","device":"cpu","bytes":104857600,"class":"interactive","ttl_ms":500,"holder":"llm"}`)
	if e != nil || l.Lease == "" {
		t.Fatalf("lease: %+v %v", l, e)
	}
	st := cpu()
	if st.LeasedBytes != 100<<20 || len(st.Leases) != 1 || st.Leases[0].Holder != "llm" || st.Leases[0].Lease != "" {
		t.Fatalf("status after the lease: %+v", st)
	}
	// Not renewed, it is gone after its ttl, and its bytes can be leased again.
	checkFor(t, "the lease expiring", gwReplyBound, pollEvery, func() error {
		if st := cpu(); st.LeasedBytes != 0 || len(st.Leases) != 0 {
			return &codec.Error{Code: codec.CodeInternal, Message: "still leased"}
		}
		return nil
	})
	if _, e := req(`{"action":"renew","lease":"` + l.Lease + `"}`); e == nil || e.Code != codec.CodeBadRequest {
		t.Errorf("renew of an expired lease: %v, want bad_request", e)
	}
	big := budget - cpu().AdmittedBytes
	l2, e := req(fmt.Sprintf(`{"action":"acquire","device":"cpu","bytes":%d,"ttl_ms":60000}`, big))
	if e != nil {
		t.Fatalf("leasing the whole free budget after the expiry: %v", e)
	}
	if _, e := req(`{"action":"release","lease":"` + l2.Lease + `"}`); e != nil {
		t.Fatal(e)
	}

	// The wrapper: CMD's exit status passes through, and no lease is left behind.
	out, code := ortbusRun(t, root, "lease", "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "1MiB", "--class", "interactive", "--", "sh", "-c", "exit 7")
	if code != 7 {
		t.Errorf("ortbus lease -- sh -c 'exit 7' exited %d (stdout %q), want 7", code, out)
	}
	if st := cpu(); st.LeasedBytes != 0 || len(st.Leases) != 0 {
		t.Errorf("a lease left behind by the wrapper: %+v", st)
	}
	// While CMD runs, its lease is held (and seen by CMD's own status request).
	out, code = ortbusRun(t, root, "lease", "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "2MiB", "--holder", "probe", "--",
		testBinary(t, "ortbus"), "status", "-s", g.Ready.NATSURL, "-json")
	if code != 0 || !strings.Contains(out, `"probe"`) {
		t.Errorf("status from inside the wrapper (exit %d) does not show its lease: %s", code, out)
	}
	// Refused: CMD does not start.
	marker := root + "/started"
	_, code = ortbusRun(t, root, "lease", "-s", g.Ready.NATSURL, "--device", "cpu", "--bytes", "100GiB", "--", "touch", marker)
	if _, err := os.Stat(marker); code != 1 || err == nil {
		t.Errorf("refused lease: exit %d, CMD started: %v; want 1 and not started", code, err == nil)
	}
}

// leaseReq sends a lease request with a JSON body, as `nats req ortbus.v1.lease` does,
// and returns the granted lease or the error.
func leaseReq(t testing.TB, g *gatewayProc, body string) (codec.LeaseReply, *codec.Error) {
	t.Helper()
	m, err := g.NC.RequestMsg(jsonMsg("ortbus.v1.lease", body), gwReplyBound)
	if err != nil {
		t.Fatal(err)
	}
	r := gwDecode(t, m)
	var l codec.LeaseReply
	if r.Err == nil {
		if err := json.Unmarshal(m.Data, &l); err != nil {
			t.Fatal(err)
		}
	}
	return l, r.Err
}

// deviceOf is device's entry in g's status.
func deviceOf(t testing.TB, g *gatewayProc, device string) codec.DeviceStatus {
	t.Helper()
	for _, d := range g.status(t).Devices {
		if d.Device == device {
			return d
		}
	}
	t.Fatalf("no device %s in status", device)
	return codec.DeviceStatus{}
}

// jsonMsg is a request on subject with a JSON body, as `nats req` sends with
// -H Content-Type:application/json.
func jsonMsg(subject, body string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	m.Header.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	return m
}

// TestReservationProtectsUrgent: on a device whose budget is nearly all reserved for the
// urgent class, the urgent pool is admitted (first, though the batch pool comes first in
// the file) and serves, and the batch pool is refused overloaded, its error naming the
// reservation.
func TestReservationProtectsUrgent(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	g := startGateway(t, gwConfig{
		Root: root,
		Devices: map[string]config.Device{"cpu": {Capacity: 1 << 30, SafeFraction: 0.5, // budget 512 MiB
			Reserve: map[string]config.Bytes{"urgent": 510 << 20}}},
		Pools: []gwPool{
			{Name: "bt", Version: "1.24.3", Classes: []string{"batch"}, Models: []string{gwTagger}},
			{Name: "ur", Version: "1.30.0", Classes: []string{"urgent"}, Models: []string{gwTagger}},
		},
		Classes: []gwClass{{Name: "urgent", Chain: []string{"ur"}}, {Name: "batch", Chain: []string{"bt"}}},
	}.write(t))
	g.waitLive(t, "ur", 1)
	st := g.waitStatus(t, "pool bt refused", func(st *codec.StatusReply) bool {
		for _, p := range st.Pools {
			if p.Name == "bt" && p.Error != nil {
				return true
			}
		}
		return false
	})
	for _, p := range st.Pools {
		if p.Name == "bt" && (p.Error.Code != codec.CodeOverloaded || !strings.Contains(p.Error.Message, "reserved for higher classes") || p.Live != 0) {
			t.Errorf("batch pool: %+v, want refused overloaded naming the reservation, no live worker", p)
		}
	}
	if r := g.call(t, "tag", &codec.Request{Path: red, Model: gwTagger, Class: "urgent", TimeoutMS: 2000}, gwReplyBound).tag(t); r.Pool != "ur" {
		t.Errorf("urgent request served by %s", r.Pool)
	}
	if r := g.call(t, "tag", &codec.Request{Path: red, Model: gwTagger, Class: "batch"}, gwReplyBound); r.code() != string(codec.CodeNoWorker) && r.code() != string(codec.CodeOverloaded) {
		t.Errorf("batch request with its pool refused: %s, want no_worker or overloaded", r.code())
	}
}
