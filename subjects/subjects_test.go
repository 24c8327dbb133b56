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
		{func() (string, error) { return InferWorker("cpu", "batch", "cpu-w1") }, "infer.cpu.batch.cpu-w1", Parsed{Kind: KindInfer, Pool: "cpu", Class: "batch", Worker: "cpu-w1"}},
		{func() (string, error) { return API(OpTag) }, "ortbus.v1.tag", Parsed{Kind: KindAPI, Op: "tag"}},
		{func() (string, error) { return Heartbeat("cuda", "w-1") }, "ortbus.hb.cuda.w-1", Parsed{Kind: KindHeartbeat, Pool: "cuda", Worker: "w-1"}},
		{func() (string, error) { return Worker("w-1", VerbDrain) }, "ortbus.worker.w-1.drain", Parsed{Kind: KindWorker, Worker: "w-1", Verb: "drain"}},
		{func() (string, error) { return ClaimFrom("ortbus.claim.gw1", "cpu", "w-1") }, "ortbus.claim.gw1.cpu.w-1", Parsed{Kind: KindClaim, Gateway: "gw1", Pool: "cpu", Worker: "w-1"}},
		{func() (string, error) { return Cancel, nil }, "ortbus.cancel", Parsed{Kind: KindCancel}},
		{func() (string, error) { return GatewayBeat("gw1") }, "ortbus.gw.gw1.hb", Parsed{Kind: KindGateway, Worker: "gw1", Verb: "hb"}},
		{func() (string, error) { return API(OpJobSubmit) }, "ortbus.v1.job.submit", Parsed{Kind: KindAPI, Op: OpJobSubmit}},
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
		"":                                 "empty",
		"a.b":                              "dot",
		"a*":                               "wildcard",
		">":                                "wildcard",
		"a b":                              "whitespace",
		"a\tb":                             "whitespace",
		"a\x00b":                           "control",
		"a\u00a0b":                         "whitespace",
		"a\xffb":                           "UTF-8",
		strings.Repeat("w", MaxTokenLen+1): "long",
	}
	for tok, why := range bad {
		for _, f := range []func() (string, error){
			func() (string, error) { return Infer(tok, "batch") },
			func() (string, error) { return Infer("cpu", tok) },
			func() (string, error) { return InferWorker("cpu", "batch", tok) },
			func() (string, error) { return Heartbeat("cpu", tok) },
			func() (string, error) { return Worker(tok, "stats") },
			func() (string, error) { return API(tok) },
			func() (string, error) { return ClaimFrom("ortbus.claim.gw", "cpu", tok) },
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
	for _, s := range []string{"", "infer.cpu", "infer.cpu.batch.x.y", "infer.cpu.batch.*", "infer.*.batch", "ortbus.v2.tag", "ortbus.hb.cpu", "foo.bar", "infer.cpu.>", "ortbus.v1. "} {
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

// A forged work item's claim_to cannot make a worker publish outside the claim subjects.
func TestClaimFromRefusesOtherSubjects(t *testing.T) {
	for _, to := range []string{"", "ortbus.claim", "ortbus.claim.*", "ortbus.claim.>", "ortbus.v1.tag", "infer.cpu.batch", "ortbus.claim.gw.x", "_INBOX.abc", "ortbus.claim.g w"} {
		if s, err := ClaimFrom(to, "cpu", "w1"); err == nil {
			t.Fatalf("claim_to %q accepted: %q", to, s)
		}
	}
}

func TestInboxOwner(t *testing.T) {
	for in, want := range map[string]string{"_INBOX.abc.1": "_INBOX.abc", "_INBOX_client.x.y.z": "_INBOX_client.x.y", "_INBOX": "", "": "", ".x": ""} {
		if got := InboxOwner(in); got != want {
			t.Fatalf("InboxOwner(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCheckReply: a reply destination is an inbox under a configured prefix, of bounded
// length and valid tokens; every other subject a requester could choose is refused.
func TestCheckReply(t *testing.T) {
	prefixes := []string{"_INBOX", "_INBOX_client", "_R_"}
	for _, ok := range []string{
		"_INBOX.8mQnSd3kZ0kXc7D4gVh2AA.1",
		"_INBOX.abc",
		"_INBOX_client.x.y",
		"_R_.aB3.Zk9",
		"_INBOX." + strings.Repeat("a", 120) + "." + strings.Repeat("b", MaxReplyLen-len("_INBOX.")-121), // exactly the limit
	} {
		if err := CheckReply(ok, prefixes); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{
		"",
		"_INBOX",          // the prefix alone
		"_INBOX.",         // an empty token
		"_INBOX..a",       // an empty token
		"_INBOXx.a",       // not the prefix's token
		"_INBOX_ops.a",    // a prefix not configured
		"_INBOX.a.>",      // wildcards
		"_INBOX.*",        // wildcards
		"_INBOX.a b",      // whitespace
		"_INBOX.a\x00",    // control
		"_INBOX.\xff\xfe", // invalid UTF-8
		"$JS.API.STREAM.PURGE.ORTBUS_JOB_ITEMS",
		"ortbus.ops.cancel",
		"ortbus.v1.tag",
		"infer.fast.interactive",
		"$SYS.REQ.SERVER.PING",
		"_INBOX." + strings.Repeat("a", 120) + "." + strings.Repeat("b", MaxReplyLen-len("_INBOX.")-120), // one byte over
		"_INBOX." + strings.Repeat("a", 4096),
	} {
		if err := CheckReply(bad, prefixes); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if CheckReply("_INBOX.a", nil) == nil {
		t.Error("accepted with no prefixes")
	}
}
