package codec

import (
	"strings"
	"testing"
)

// TestGateValidate: a gate state from the bus is refused when its ttl is not 1 ms to
// MaxGateTTLMS, its reclaim list is too long or holds what is no tag, or a name is too
// long; LeaseTag is 16 hex digits that do not reveal the id.
func TestGateValidate(t *testing.T) {
	good := Gate{Gateway: "gw", Device: "cuda:0", Seq: 1, Closed: true, Class: "urgent", TTLMS: 300, Reclaim: []string{LeaseTag("x")}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*Gate){
		"ttl 0":        func(g *Gate) { g.TTLMS = 0 },
		"ttl negative": func(g *Gate) { g.TTLMS = -1 },
		"ttl too long": func(g *Gate) { g.TTLMS = MaxGateTTLMS + 1 },
		"bad tag":      func(g *Gate) { g.Reclaim = []string{"short"} },
		"many tags":    func(g *Gate) { g.Reclaim = make([]string, MaxGateReclaim+1) },
		"long device":  func(g *Gate) { g.Device = strings.Repeat("d", MaxIDLen+1) },
	} {
		g := good
		edit(&g)
		if err := g.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	tag := LeaseTag("lease-id")
	if len(tag) != LeaseTagLen || strings.Contains(tag, "lease") || tag == LeaseTag("lease-id2") {
		t.Errorf("tag %q", tag)
	}
}

// TestLeaseRequestHolderFields: pid and host are checked.
func TestLeaseRequestHolderFields(t *testing.T) {
	ok := LeaseRequest{Action: LeaseRenew, Lease: "abc", PID: 42, Host: "box.local"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []LeaseRequest{
		{Action: LeaseRenew, Lease: "abc", PID: -1},
		{Action: LeaseRenew, Lease: "abc", PID: 1 << 23},
		{Action: LeaseRenew, Lease: "abc", Host: "a b"},
		{Action: LeaseRenew, Lease: "abc", Host: strings.Repeat("h", 256)},
	} {
		if err := r.Validate(); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
}

// FuzzDecodeGate: a gate state from the bus (a wrapper decodes whatever is published on
// its gate's subject) never panics the decoder, and what validates encodes again.
func FuzzDecodeGate(f *testing.F) {
	seeds(f, false)
	good, _ := Marshal(&Gate{Gateway: "gw", Device: "cuda:0", Seq: 7, Closed: true, Class: "urgent", TTLMS: 300, Reclaim: []string{LeaseTag("x")}})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		var g Gate
		err := Unmarshal(b, &g)
		checkDecodeErr(t, err)
		if err == nil && g.Validate() == nil {
			if _, err := Marshal(&g); err != nil {
				t.Fatalf("a valid gate state does not encode: %v", err)
			}
		}
	})
}
