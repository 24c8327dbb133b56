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
//     owner, tenant "": jobs and leases on such a bus are everybody's (SECURITY.md).
//  2. With gateway.identity = "account" (deploy/accounts: each application in a NATS
//     account of its own, importing ortbus's API as a service), a request that crossed
//     the import carries the header Nats-Request-Info, which nats-server writes itself —
//     replacing any the requester wrote — with the requester's account: the tenant is
//     "account:<name>". A request without it came from inside ortbus's own account
//     (operators, peers): tenant "", the local owner, who may see and cancel every job.
//     No application may have a user in ortbus's account, where it could write the
//     header itself.
//  3. Request ids are per tenant: a tenant's request runs under an id of the gateway's
//     (tenantID: a hash of the tenant and its id), answered with its own id, and its
//     cancels and resends name its own id; so one tenant's id never collides with,
//     reveals or blocks another's (two tenants may both use "1"), and workers, claims and
//     cancels on the bus see only the gateway's ids.
//  4. Over HTTP the tenant is "" too: the HTTP API is loopback-bound and its bearer token
//     is the operator's.
//  5. A tenant other than "" sees only its own jobs (another's is unknown_job, its id
//     conflict to a submit: jobs.Store.owned), renews and releases only its own leases,
//     and is bounded on its own (tenantShare): leases, cancels of unknown ids, requests
//     accepted and unanswered, and running jobs (jobs.max_running), so that one tenant's
//     flood never refuses another tenant's first request.
//
// Requests and their cancels: without a tenant, the owner is the requesting
// connection's inbox (canCancel). A tenant's requests are owned by the tenant itself
// (tenantOwner): across an import the reply subject is _R_.<prefix>.<n>, whose prefix is
// the exporting account's on the requester's server — shared by every importing account —
// so it names no owner. Such a reply is also never given to a worker to answer straight
// (replyDirect): nats-server refuses a publish whose reply subject is _R_.…

// requestInfoHeader is the header nats-server sets on a request that crossed a service
// import (its ClientInfoHdr).
const requestInfoHeader = "Nats-Request-Info"

// tenantShare is the share of a bound one tenant may hold: a tenant other than the local
// owner takes at most 1/tenantShare of the leases, early cancels, queued requests or
// active jobs, so the rest stays for the others.
const tenantShare = 4

// tenantOf is the tenant of a request with headers h (rules 1 and 2).
func tenantOf(cfg *config.Config, h micro.Headers) string {
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
		// The server writes it well formed; a malformed one fails closed: a tenant that
		// owns nothing, never the local owner.
		return "account:"
	}
	return "account:" + ci.Account
}

// tenantBound is the bound of one tenant other than the local owner, for a total bound.
func tenantBound(total int) int { return max(1, total/tenantShare) }

// totalQueueBound is the sum of the class queues' bounds: what one tenant's unanswered
// requests are bounded against.
func totalQueueBound(c *config.Config) int {
	n := 0
	for _, cl := range c.Classes {
		n += cl.QueueBound
	}
	return n
}

// tenantOwnerMark starts the owner of a tenant's requests (canCancel, ownerOf). A space
// is in no subject, so no reply subject reads as one.
const tenantOwnerMark = "tenant "

// tenantOwner is the owner (and cancel sender) of tenant's requests.
func tenantOwner(tenant string) string { return tenantOwnerMark + tenant }

// tenantID is the id under which the gateway runs tenant's request id (rule 3); the local
// owner's ids are their own.
func tenantID(tenant, id string) string {
	if tenant == "" {
		return id
	}
	sum := sha256.Sum256([]byte(tenant + "\x00" + id))
	return "~" + hex.EncodeToString(sum[:16])
}
