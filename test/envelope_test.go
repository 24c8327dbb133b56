package test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// envelopeBadReplies are reply subjects that no requester's inbox has: a reply subject of
// about 4 KB (under _INBOX, every token valid: only its length is wrong; the attacker's
// own PUB still fits the server's control line, the gateway's forwarding publish would
// not), JetStream's API, the operators' cancel, a pool's work subject, the API, $SYS, and
// any other subject.
func envelopeBadReplies() []string {
	long := "_INBOX"
	for len(long) < 3900 {
		long += "." + strings.Repeat("x", 100)
	}
	return []string{
		long,
		"$JS.API.STREAM.PURGE.ORTBUS_JOB_ITEMS",
		subjects.OpsCancel,
		"infer.ia.interactive",
		"ortbus.v1.status",
		"$SYS.REQ.SERVER.PING",
		"app.events",
	}
}

// TestReplySubjectChecked: a request whose reply subject is not a reply destination
// (subjects.CheckReply) is dropped and counted by the gateway (ortbus_bad_messages_total
// {kind="reply_subject"}) and, sent straight to a worker, by the worker (its heartbeat's
// bad_messages); nothing is published on any of those subjects on its behalf, no
// connection is lost, and good requests are served after each attack.
func TestReplySubjectChecked(t *testing.T) {
	g, img := sharedGateway(t)
	bad := envelopeBadReplies()

	// The spy hears every subject a bad reply names (the long one by its first tokens).
	heard := make(chan *nats.Msg, 1024)
	for _, b := range bad {
		subj := b
		if len(subj) > 256 {
			subj = "_INBOX.>"
		}
		sub, err := g.NC.ChanSubscribe(subj, heard)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	if err := g.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	isBad := func(s string) bool {
		for _, b := range bad {
			if s == b {
				return true
			}
		}
		return false
	}
	expectNothing := func(when string) {
		t.Helper()
		if err := g.NC.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case m := <-heard:
				// An answer carries no reply subject; the test's own items sent to
				// infer.ia.interactive do.
				if isBad(m.Subject) && m.Reply == "" {
					t.Fatalf("%s: a message was published on the reply subject %.80q", when, m.Subject)
				}
				continue
			default:
			}
			return
		}
	}

	// 1. Through the gateway: a valid tag request with each bad reply subject, then a good
	// one on the same connection and endpoint (so handled after them).
	before := badReplyCount(t, g)
	body, err := codec.Marshal(&codec.Request{Path: img["red"], Model: gwTagger})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		if err := g.NC.PublishMsg(&nats.Msg{Subject: "ortbus.v1.tag", Reply: b, Data: body}); err != nil {
			t.Fatalf("publish with reply %.40q: %v", b, err)
		}
	}
	checkColourTag(t, g.call(t, "tag", &codec.Request{Path: img["red"], Model: gwTagger}, gwReplyBound).tag(t), "red")
	gwSettle(t, g) // every answer that could have been sent was sent
	expectNothing("through the gateway")
	if got := badReplyCount(t, g) - before; got != float64(len(bad)) {
		t.Fatalf("ortbus_bad_messages_total{kind=\"reply_subject\"} grew by %v, want %d", got, len(bad))
	}

	// 2. Straight to the pool's workers: the worker checks again.
	workerBad := func(st *codec.StatusReply) uint64 {
		var n uint64
		for _, w := range st.Workers {
			n += w.Heartbeat.BadMessages
		}
		return n
	}
	wBefore := workerBad(g.status(t))
	item, err := codec.Marshal(tagItem("envelope-bad", img["blue"]))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		if err := g.NC.PublishMsg(&nats.Msg{Subject: "infer.ia.interactive", Reply: b, Data: item}); err != nil {
			t.Fatal(err)
		}
	}
	good, err := g.NC.Request("infer.ia.interactive", mustMarshal(t, tagItem("envelope-good", img["blue"])), gwReplyBound)
	if err != nil {
		t.Fatalf("a good item after the bad ones: %v", err)
	}
	var tr codec.TagReply
	result(t, good, &tr)
	checkColourTag(t, &tr, "blue")
	g.waitStatus(t, "the workers' heartbeats counting the bad reply subjects", func(st *codec.StatusReply) bool {
		return workerBad(st)-wBefore >= uint64(len(bad))
	})
	expectNothing("straight to a worker")
	if n := workerBad(g.status(t)) - wBefore; n != uint64(len(bad)) {
		t.Fatalf("workers counted %d bad messages, want %d", n, len(bad))
	}

	// 3. The gateway still serves, over NATS (its connection was never closed) and HTTP.
	checkColourTag(t, g.call(t, "tag", &codec.Request{Path: img["green"], Model: gwTagger}, gwReplyBound).tag(t), "green")
	if !g.alive() {
		t.Fatal("the gateway exited")
	}
}

// badReplyCount is the gateway's ortbus_bad_messages_total{kind="reply_subject"}.
func badReplyCount(t *testing.T, g *gatewayProc) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^ortbus_bad_messages_total\{kind="reply_subject"\} (\S+)$`).FindStringSubmatch(gwScrape(t, g.Ready.HTTP))
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := codec.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
