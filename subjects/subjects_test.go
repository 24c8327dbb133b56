package subjects

import (
	"strings"
	"testing"
)

func TestBuildAndParse(t *testing.T) {
	cases := []struct {
		build func() (string, error)
		want  string
		p     Parsed
	}{
		{func() (string, error) { return Infer("openvino", "interactive") }, "infer.openvino.interactive", Parsed{Kind: KindInfer, Pool: "openvino", Class: "interactive"}},
		{func() (string, error) { return API(OpTag) }, "ortbus.v1.tag", Parsed{Kind: KindAPI, Op: "tag"}},
		{func() (string, error) { return Heartbeat("cuda", "w-1") }, "ortbus.hb.cuda.w-1", Parsed{Kind: KindHeartbeat, Pool: "cuda", Worker: "w-1"}},
		{func() (string, error) { return Worker("w-1", VerbDrain) }, "ortbus.worker.w-1.drain", Parsed{Kind: KindWorker, Worker: "w-1", Verb: "drain"}},
		{func() (string, error) { return Claim("gw1") }, "ortbus.claim.gw1", Parsed{Kind: KindClaim, Worker: "gw1"}},
		{func() (string, error) { return Cancel, nil }, "ortbus.cancel", Parsed{Kind: KindCancel}},
		{func() (string, error) { return GatewayBeat("gw1") }, "ortbus.gw.gw1.hb", Parsed{Kind: KindGateway, Worker: "gw1", Verb: "hb"}},
		{func() (string, error) { return GatewayLog("gw1") }, "ortbus.gw.gw1.log", Parsed{Kind: KindGateway, Worker: "gw1", Verb: "log"}},
	}
	for _, c := range cases {
		s, err := c.build()
		if err != nil || s != c.want {
			t.Fatalf("build = %q, %v; want %q", s, err, c.want)
		}
		p, err := Parse(s)
		if err != nil || p != c.p {
			t.Fatalf("Parse(%q) = %+v, %v; want %+v", s, p, err, c.p)
		}
	}
}

func TestBadTokens(t *testing.T) {
	bad := map[string]string{
		"":         "empty",
		"a.b":      "dot",
		"a*":       "wildcard",
		">":        "wildcard",
		"a b":      "whitespace",
		"a\tb":     "whitespace",
		"a\x00b":   "control",
		"a\u00a0b": "whitespace",
	}
	for tok, why := range bad {
		for _, f := range []func() (string, error){
			func() (string, error) { return Infer(tok, "batch") },
			func() (string, error) { return Infer("cpu", tok) },
			func() (string, error) { return Heartbeat("cpu", tok) },
			func() (string, error) { return Worker(tok, "stats") },
			func() (string, error) { return API(tok) },
		} {
			s, err := f()
			if err == nil {
				t.Fatalf("token %q accepted (built %q)", tok, s)
			}
			if !strings.Contains(err.Error(), why) {
				t.Fatalf("token %q: error %q does not say %q", tok, err, why)
			}
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, s := range []string{"", "infer.cpu", "infer.cpu.batch.x", "infer.*.batch", "ortbus.v2.tag", "ortbus.hb.cpu", "foo.bar", "infer.cpu.>", "ortbus.v1. "} {
		if p, err := Parse(s); err == nil {
			t.Fatalf("Parse(%q) accepted: %+v", s, p)
		}
	}
}

func TestInferQueue(t *testing.T) {
	if q := InferQueue("cuda"); q != "ortworker-cuda" {
		t.Fatalf("InferQueue = %q", q)
	}
}
