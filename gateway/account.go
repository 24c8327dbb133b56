package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/nats-io/nats.go/micro"

	"github.com/ortbus/ortbus/config"
)

// Identity: who owns a request, a job, a lease or a cancel is what the bus says about
// its sender, never what a body claims. The rules:
//
//  1. With gateway.identity = "local" (the default: an embedded or single-account bus,
//     where any connection could write any header), every requester is the one local
//     owner, account "": jobs and leases on such a bus are everybody's (SECURITY.md).
//  2. With gateway.identity = "account" (deploy/accounts: each application in a NATS
//     account of its own, importing ortbus's API as a service), a request that crossed
//     the import carries the header Nats-Request-Info, which nats-server writes itself —
//     replacing any the requester wrote — with the requester's account: the account is
//     "account:<name>". A request without it came from inside ortbus's own account
//     (operators, peers): account "", the local owner, who may see and cancel every job.
//     No application may have a user in ortbus's account, where it could write the
//     header itself.
//  3. Request ids are per account: an account's request runs under an id of the gateway's
//     (accountScopedID: a hash of the account and its id), answered with its own id, and its
//     cancels and resends name its own id; so one account's id never collides with,
//     reveals or blocks another's (two accounts may both use "1"), and workers, claims and
//     cancels on the bus see only the gateway's ids.
//  4. Over HTTP the account is "" too: the HTTP API is loopback-bound and its bearer token
//     is the operator's.
//  5. An account other than "" sees only its own jobs (another's is unknown_job, its id
//     conflict to a submit: jobs.Store.owned), renews and releases only its own leases,
//     and is bounded on its own (accountShare): leases, cancels of unknown ids, requests
//     accepted and unanswered, and running jobs (jobs.max_running), so that one account's
//     flood never refuses another account's first request.
//
// Requests and their cancels: without an account, the owner is the requesting
// connection's inbox (canCancel). An account's requests are owned by the account itself
// (accountOwner): across an import the reply subject is _R_.<prefix>.<n>, whose prefix is
// the exporting account's on the requester's server — shared by every importing account —
// so it names no owner. Such a reply is also never given to a worker to answer straight
// (replyDirect): nats-server refuses a publish whose reply subject is _R_.…
//
// In the gateway the owner is an account everywhere ("" the local one); "tenant" names
// only a process beside ortbus on a device, such as an LLM server under a gated lease
// (gate.go, policy.go).

// requestInfoHeader is the header nats-server sets on a request that crossed a service
// import (its ClientInfoHdr).
const requestInfoHeader = "Nats-Request-Info"

// accountShare is the share of a bound one account may hold: an account other than the local
// owner takes at most 1/accountShare of the leases, early cancels, queued requests or
// active jobs, so the rest stays for the others.
const accountShare = 4

// accountOf is the account of a request with headers h (rules 1 and 2).
func accountOf(cfg *config.Config, h micro.Headers) string {
	if cfg.Gateway.Identity != config.IdentityAccount {
		return ""
	}
	v := h.Get(requestInfoHeader)
	if v == "" {
		return ""
	}
	var ci struct {
		Account string `json:"acc"`
	}
	if len(v) > 64<<10 || json.Unmarshal([]byte(v), &ci) != nil || ci.Account == "" || len(ci.Account) > 256 {
		// The server writes it well formed; a malformed one fails closed: an account that
		// owns nothing, never the local owner.
		return accountPrefix
	}
	return accountPrefix + ci.Account
}

// accountBound is the bound of one account other than the local owner, for a total bound.
func accountBound(total int) int { return max(1, total/accountShare) }

// totalQueueBound is the sum of the class queues' bounds: what one account's unanswered
// requests are bounded against.
func totalQueueBound(c *config.Config) int {
	n := 0
	for _, cl := range c.Classes {
		n += cl.QueueBound
	}
	return n
}

// accountOwnerMark starts the owner of an account's requests (canCancel, ownerOf). A space
// is in no subject, so no reply subject reads as one. Its text keeps the older word
// ("tenant ") on purpose: an owner is hashed into the answers bucket's keys (answerKey,
// failover.go), which every gateway of a cluster reads, so a new text would hide the
// answers an older gateway kept from a resend during a rolling upgrade.
const accountOwnerMark = "tenant "

// accountOwner is the owner (and cancel sender) of account's requests.
func accountOwner(account string) string { return accountOwnerMark + account }

// accountScopedID is the id under which the gateway runs account's request id (rule 3);
// the local owner's ids are their own.
func accountScopedID(account, id string) string {
	if account == "" {
		return id
	}
	sum := sha256.Sum256([]byte(account + "\x00" + id))
	return "~" + hex.EncodeToString(sum[:16])
}
