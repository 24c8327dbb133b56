package gateway

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// leaseAs is the API's lease decision for account: the configuration in force read once,
// and the budget's decision under it (api.go).
func leaseAs(g *Gateway, req *codec.LeaseRequest, account string) (*codec.LeaseReply, *codec.Error) {
	return g.budget.lease(g.conf(), req, account)
}

// leaseOwn is leaseAs for the local owner.
func leaseOwn(g *Gateway, req *codec.LeaseRequest) (*codec.LeaseReply, *codec.Error) {
	return leaseAs(g, req, "")
}

// reloadedConfig is admissionConfig after a reload that changes everything a lease's
// decision reads: cuda:0 is 4 GiB at a safe fraction of 0.5 (a 2 GiB budget), with
// reserve's lines under [devices."cuda:0".reserve], and leases default to a minute.
func reloadedConfig(reserve string) string {
	return strings.Replace(admissionConfig, `[devices."cuda:0"]
capacity = "1GiB"`, `[gateway]
lease_default_ttl = "1m"
[devices."cuda:0"]
capacity = "4GiB"
safe_fraction = 0.5
[devices."cuda:0".reserve]
`+reserve, 1)
}

// TestLeaseDecisionOneConfig: a reload that lands while a lease is being decided (here:
// when the decision reads the leases' clock, after its caller read the configuration)
// changes the next decision, never half of this one (budget.go: one configuration
// per decision). Each decision's figures — ttl, capacity, safe fraction, reservations —
// are all the old configuration's, and the next decision's all the new one's.
func TestLeaseDecisionOneConfig(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name  string
		bytes int64
		// under the old config alone: granted (ttl the old default) or refused by its
		// 870.4 MiB budget; the new one would decide the other way.
		granted bool
		reserve string // the reloaded config's reservations
	}{
		// 900 MiB fits the new 2 GiB budget.
		{"refused by the old budget", 900 * mib, false, `interactive = "1MiB"`},
		// The new reservation for urgent leaves 248 MiB to interactive.
		{"granted by the old budget", 500 * mib, true, `urgent = "1800MiB"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			next := parseConfig(t, reloadedConfig(c.reserve))
			if next.Gateway.LeaseDefaultTTL.D() != time.Minute {
				t.Fatalf("reloaded config: lease_default_ttl %v", next.Gateway.LeaseDefaultTTL.D())
			}
			g := testGateway(t, admissionConfig)
			old := g.conf()
			var reloads atomic.Int32
			leaseNow = func() time.Time {
				if reloads.Add(1) == 1 {
					g.reloader.cfg.Store(next) // a reload, in the middle of the decision
				}
				return now
			}
			t.Cleanup(func() { leaseNow = time.Now })
			req := &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: c.bytes, Class: "interactive"}
			l, e := leaseOwn(g, req)
			if reloads.Load() == 0 || g.conf() != next {
				t.Fatal("the reload did not land during the decision")
			}
			if c.granted {
				if e != nil {
					t.Fatalf("refused under the new config's reservation: %v", e)
				}
				if want := now.Add(old.Gateway.LeaseDefaultTTL.D()).UnixMilli(); l.ExpiresUnixMS != want {
					t.Errorf("granted with expiry %d, want the old default ttl's %d", l.ExpiresUnixMS, want)
				}
			} else {
				if e == nil {
					t.Fatalf("granted under the new config's budget: %+v", l)
				}
				if e.Code != codec.CodeOverloaded || e.Details["budget_bytes"] != int64(cudaBudget) || e.Details["capacity_bytes"] != int64(1<<30) ||
					!strings.Contains(e.Message, "x 0.85") {
					t.Errorf("refusal %v %v, want the old budget (1 GiB x 0.85) throughout", e, e.Details)
				}
			}

			// The next decision is the new configuration's, whole.
			l, e = leaseOwn(g, req)
			if c.granted {
				if e == nil || e.Details["budget_bytes"] != int64(2<<30) || e.Details["capacity_bytes"] != int64(4<<30) {
					t.Errorf("under the new config: %+v %v, want refused by its reservation, budget 2 GiB x 0.5", l, e)
				}
			} else if e != nil || l.ExpiresUnixMS != now.Add(time.Minute).UnixMilli() {
				t.Errorf("under the new config: %+v %v, want granted for its default minute", l, e)
			}
		})
	}
}
