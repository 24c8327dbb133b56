package gateway

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
)

// onClaim takes a claim only as its subject names it, and answers its verdict only on the
// claiming worker's verdict subject: a claim whose reply subject is anything else (another
// worker's verdict subject, a work subject, a client's inbox) is dropped and counted, so
// a forged claim cannot make the gateway publish where it chooses.
func TestOnClaimVerdictSubject(t *testing.T) {
	g := unitGateway(t)
	claim := func(worker string) []byte {
		b, err := codec.Marshal(&codec.Claim{ID: "x", Attempt: 1, Pool: "cpu", Worker: worker, State: codec.ClaimTaken})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		reply string
		bad   bool
	}{
		{"ortbus.worker.w1.verdict", false},
		{"", false},
		{"ortbus.worker.w2.verdict", true},
		{"ortbus.worker.w1.drain", true},
		{"infer.cpu.batch", true},
		{"_INBOX.client.1", true},
	} {
		before := badCount(g, "claim")
		g.d.onClaim(&nats.Msg{Subject: "ortbus.claim.unit.cpu.w1", Reply: tc.reply, Data: claim("w1")})
		if got := badCount(g, "claim") - before; got != map[bool]float64{true: 1, false: 0}[tc.bad] {
			t.Errorf("claim with reply subject %q: counted bad %v times, want bad %v", tc.reply, got, tc.bad)
		}
	}
}
