package gateway

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/jobs"
	"github.com/ortbus/ortbus/subjects"
)

// Identity (account.go), in process: accounts from the header nats-server writes, and
// the ids, bounds and ownership of rules 3 and 5, without NATS.

func TestAccountOf(t *testing.T) {
	g := unitGateway(t)
	hdr := func(v string) micro.Headers { return micro.Headers{requestInfoHeader: {v}} }
	// Rule 1: in local mode the header means nothing (any connection could write it).
	if got := accountOf(g.conf(), hdr(`{"acc":"APP1"}`)); got != "" {
		t.Fatalf("local mode: account %q, want the local owner", got)
	}
	g.conf().Gateway.Identity = config.IdentityAccount
	for _, c := range []struct {
		h    micro.Headers
		want string
	}{
		{micro.Headers{}, ""}, // from ortbus's own account: the local owner
		{hdr(`{"acc":"APP1","rtt":1000}`), "account:APP1"},
		{hdr(`{"acc":"APP2","user":"bun"}`), "account:APP2"},
		// Malformed (never written so by the server): an account that owns nothing, never
		// the local owner.
		{hdr(`{"acc":""}`), "account:"},
		{hdr(`not json`), "account:"},
		{hdr(`{"acc":"` + strings.Repeat("a", 300) + `"}`), "account:"},
		{hdr(strings.Repeat("[", 70<<10)), "account:"},
	} {
		if got := accountOf(g.conf(), c.h); got != c.want {
			t.Errorf("headers %.60v: account %q, want %q", c.h, got, c.want)
		}
	}
}

// Rule 4 for leases: another account's lease is not found; one account holds at most
// accountBound(maxLeases), and another account's first lease is still granted.
func TestLeaseOwners(t *testing.T) {
	g := testGateway(t, admissionConfig)
	a, b := "account:A", "account:B"
	acquire := func(account string) (*codec.LeaseReply, *codec.Error) {
		return leaseAs(g, &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cuda:0", Bytes: 1, TTLMS: 60000}, account)
	}
	la, e := acquire(a)
	if e != nil {
		t.Fatal(e)
	}
	for _, action := range []string{codec.LeaseRenew, codec.LeaseRelease} {
		if _, e := leaseAs(g, &codec.LeaseRequest{Action: action, Lease: la.Lease}, b); e == nil || e.Code != codec.CodeBadRequest {
			t.Fatalf("%s of A's lease by B: %v, want no such lease", action, e)
		}
	}
	if r, e := leaseAs(g, &codec.LeaseRequest{Action: codec.LeaseRenew, Lease: la.Lease}, a); e != nil || r.Lease != la.Lease {
		t.Fatalf("renew by its owner: %v", e)
	}
	for i := 1; i < accountBound(maxLeases); i++ {
		if _, e := acquire(a); e != nil {
			t.Fatalf("A's lease %d: %v", i+1, e)
		}
	}
	if _, e := acquire(a); e == nil || e.Code != codec.CodeOverloaded {
		t.Fatalf("A past its bound: %v, want overloaded", e)
	}
	if _, e := acquire(b); e != nil {
		t.Fatalf("B's first lease while A holds its bound: %v", e)
	}
	// The local owner (an operator) may release any lease.
	if r, e := leaseAs(g, &codec.LeaseRequest{Action: codec.LeaseRelease, Lease: la.Lease}, ""); e != nil || !r.Released {
		t.Fatalf("release by the local owner: %v", e)
	}
	if _, e := acquire(a); e != nil {
		t.Fatalf("A after one of its leases went: %v", e)
	}
}

// Rule 4 for requests and early cancels: one account's unanswered requests and cancels of
// unknown ids are bounded on their own.
func TestAccountRequestBound(t *testing.T) {
	lc := newTestLifecycle()
	lc.accountMax = 2
	now := time.Now()
	p := func(id, account string) *pending {
		return &pending{id: id, account: account, owner: "_INBOX.x", class: "urgent", deadline: now.Add(time.Minute)}
	}
	admit := func(q *pending) *codec.Error { return answerOf(lc.accept(q, []string{"gpu"}, now)) }
	for _, q := range []*pending{p("a1", "account:A"), p("a2", "account:A")} {
		if e := admit(q); e != nil {
			t.Fatal(e)
		}
	}
	if e := admit(p("a3", "account:A")); e == nil || e.Code != codec.CodeOverloaded {
		t.Fatalf("A's third request: %v, want overloaded", e)
	}
	if e := admit(p("b1", "account:B")); e != nil {
		t.Fatalf("B's first request while A is at its bound: %v", e)
	}
	if e := admit(p("l1", "")); e != nil {
		t.Fatalf("the local owner is bounded by the queues only: %v", e)
	}
	if found, _ := lc.cancel("a1", "", "", false, now); !found { // answered (cancelled)
		t.Fatal("a1 not found")
	}
	if e := admit(p("a4", "account:A")); e != nil {
		t.Fatalf("A after one answer: %v", e)
	}
	// Early cancels: A's fill its share, B's first is still remembered.
	for i := 0; i < accountBound(maxEarlyCancels)+10; i++ {
		lc.cancel("unknown-a-"+strconv.Itoa(i), "_R_.a.1", "account:A", false, now)
	}
	lc.cancel("unknown-b", "_R_.b.1", "account:B", false, now)
	nA := lc.earlyOf("account:A")
	_, bKept := lc.early["unknown-b"]
	if nA != accountBound(maxEarlyCancels) || !bKept {
		t.Fatalf("early cancels: A kept %d (bound %d), B's kept %v", nA, accountBound(maxEarlyCancels), bKept)
	}
}

// Rule 4 for jobs: an account runs at most accountBound(jobs.max_running) jobs, another
// account's first job is still taken, a re-submit of a job that exists is no new job, and
// the total bound holds for everyone.
func TestAccountJobBound(t *testing.T) {
	g := unitGateway(t)
	g.conf().Jobs.MaxRunning = 8 // an account: 2
	s, err := jobs.Open(context.Background(), testenv.InProcessJetStream(t), g.conf().Jobs, g.log)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	submit := func(id, account string) *codec.Error {
		rec := &jobs.Record{Job: id, Op: "tag", Class: "batch", Owner: account}
		if e := g.jobs.runningRoom(ctx, s, rec, account); e != nil {
			return e
		}
		_, e := s.Submit(ctx, rec, []string{"/srv/" + id + ".png"})
		return e
	}
	for _, id := range []string{"a1", "a2"} {
		if e := submit(id, "account:A"); e != nil {
			t.Fatal(e)
		}
	}
	if e := submit("a3", "account:A"); e == nil || e.Code != codec.CodeOverloaded {
		t.Fatalf("A's third running job: %v, want overloaded", e)
	}
	if e := submit("a2", "account:A"); e != nil {
		t.Fatalf("A's re-submit of a2: %v", e)
	}
	if e := submit("b1", "account:B"); e != nil {
		t.Fatalf("B's first job while A is at its bound: %v", e)
	}
	for i := range 5 { // the local owner: up to the total
		if e := submit("l"+strconv.Itoa(i), ""); e != nil {
			t.Fatalf("local job %d: %v", i, e)
		}
	}
	if e := submit("l9", ""); e == nil || e.Code != codec.CodeOverloaded {
		t.Fatalf("past jobs.max_running: %v, want overloaded", e)
	}
}

// An account's requests are owned by the account, not by their _R_ reply subject (which
// every importing account shares): another account's cancel, or one from a reply subject
// alone, finds nothing; the account's own cancel, from any connection, and an operator's
// do.
func TestAccountCancelOwner(t *testing.T) {
	a, b := accountOwner("account:A"), accountOwner("account:B")
	if got := ownerOf(a); got != a {
		t.Fatalf("ownerOf(%q) = %q", a, got)
	}
	for _, c := range []struct {
		owner, by string
		want      bool
	}{
		{a, a, true},
		{a, b, false},
		{a, "_R_.abc.1", false}, // the shared import prefix names no one
		{"_R_.abc", a, false},
		{a, "", true}, // an operator
		{a, ownerHTTP, false},
	} {
		if got := canCancel(c.owner, c.by); got != c.want {
			t.Errorf("canCancel(%q, %q) = %v, want %v", c.owner, c.by, got, c.want)
		}
	}
}

// Rule 3: request ids are per account. Two accounts may both send id "1": both are
// accepted, each under an id of the gateway's; an account's cancel of "1" reaches its own
// request only, and the local owner's "1" is its own id.
func TestAccountRequestIDs(t *testing.T) {
	g := unitGateway(t)
	body, err := codec.Marshal(&codec.Request{ID: "1", Path: "/srv/a.png", Class: "batch", TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	answers := map[string]*codec.Error{}
	submit := func(account, replyTo string) {
		g.submitFrom(context.Background(), subjects.OpTag, body, false, replyTo, ownerOf(accountOwner(account)), account, func(_ []byte, e *codec.Error) { answers[account] = e })
	}
	submit("account:A", "_R_.x.1")
	submit("account:B", "_R_.x.2")
	held := map[string]string{} // id: client id
	g.d.inspect(func(lc *lifecycle) {
		for id, f := range lc.byID {
			held[id] = f.p.clientID
		}
	})
	if len(answers) != 0 {
		t.Fatalf("answered at once: %v", answers)
	}
	ida, idb := accountScopedID("account:A", "1"), accountScopedID("account:B", "1")
	if ida == idb || ida == "1" {
		t.Fatalf("ids %q and %q", ida, idb)
	}
	for _, id := range []string{ida, idb} {
		if cid, ok := held[id]; !ok || cid != "1" {
			t.Fatalf("no request %s with client id 1", id)
		}
	}
	if g.d.cancelAs("1", accountOwner("account:C"), "account:C") {
		t.Fatal("C's cancel of 1 found a request")
	}
	if !g.d.cancelAs("1", accountOwner("account:B"), "account:B") {
		t.Fatal("B's cancel of its own 1 found nothing")
	}
	if e := answers["account:B"]; e == nil || e.Code != codec.CodeCancelled {
		t.Fatalf("B's request: %v, want cancelled", answers["account:B"])
	}
	if _, ok := answers["account:A"]; ok {
		t.Fatalf("A's request was answered: %v", answers["account:A"])
	}
	if !slices.Contains(unanswered(g), ida) {
		t.Fatal("A's request is gone")
	}
	if accountScopedID("", "1") != "1" {
		t.Fatal("the local owner's id is not its own")
	}
}
