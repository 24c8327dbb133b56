// Package subjects names every NATS subject of ortbus and parses them back. It is the
// only place a subject string is built, so the grammar of the bus lives in one file:
//
//	infer.<pool>.<class>              work items, served by the workers of <pool>
//	ortbus.v1.<op>                    the client API, served by the gateway(s)
//	ortbus.hb.<pool>.<worker>         heartbeats, published by each worker
//	ortbus.cancel                     cancellation of one request id, heard by workers
//	ortbus.worker.<worker>.<verb>     control of one worker (drain, stats)
//	ortbus.claim.<gateway>.<pool>.<worker>  claims: a worker tells the dispatching gateway it took an item
//	ortbus.ops.cancel                 an operator's cancel of any request (ops role only)
//	ortbus.ops.reload                 re-read the gateway's config file and apply it (ops role only)
//	ortbus.ops.model                  load, unload or reload one model at run time (ops role only)
//	ortbus.gw.<gateway>.hb            a gateway's own heartbeat (failover between gateways)
//	ortbus.gw.<gateway>.log           a gateway's journal of accepted requests (failover)
//	ortbus.v1.job.<verb>              the job API (submit, status, cancel, list, results)
//	ortbus.job.item.<job>             a job's items waiting to run (JetStream work queue)
//	ortbus.job.result.<job>.<n>       item n's one result (JetStream, one message per subject)
//	ortbus.job.run.<job>.<n>.<k>      the mark of item n's k-th run (k = 1, 2)
//	ortbus.gate.<gateway>.<device>    a device's compute gate, published by the gateway that holds its leases
//	ortbus.v1.cache.<verb>            the result cache's API (stats, purge)
//	ortbus.cache.<m>.<r>.<o>.<key>    one cached answer (JetStream, one message per subject)
//
// The version of the client API is in its subjects (v1); a new wire generation gets new
// subjects and both can be served side by side.
package subjects

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Prefixes and fixed subjects.
const (
	InferPrefix  = "infer"
	APIPrefix    = "ortbus.v1"
	HBPrefix     = "ortbus.hb"
	Cancel       = "ortbus.cancel"
	WorkerPrefix = "ortbus.worker"
	ClaimPrefix  = "ortbus.claim"
	GWPrefix     = "ortbus.gw"
	// OpsCancel is the operators' cancel: honoured for any request, where ortbus.v1.cancel
	// is honoured only for the connection that sent the request.
	OpsCancel = "ortbus.ops.cancel"
	// OpsReload re-reads the answering gateway's config file and applies it (ModelControl
	// is not needed; the reply is a ReloadReply).
	OpsReload = "ortbus.ops.reload"
	// OpsModel loads, unloads or reloads one model (a ModelControl; a ReloadReply).
	OpsModel = "ortbus.ops.model"
	// GWAll matches every gateway heartbeat subject.
	GWAll = GWPrefix + ".*.hb"

	// HBAll matches every heartbeat.
	HBAll = HBPrefix + ".>"
	// APIAll matches every client API subject.
	APIAll = APIPrefix + ".>"
	// InferAll matches every work subject.
	InferAll = InferPrefix + ".>"

	// GatewayQueue is the queue group of the client API, so several gateways share it.
	GatewayQueue = "ortbus-gateway"
	// ServiceName is the NATS micro service name of the gateway.
	ServiceName = "ortbus"
)

// Client API operations.
const (
	OpTag     = "tag"
	OpEmbed   = "embed"
	OpCompare = "compare"
	OpDetect  = "detect"
	OpSegment = "segment"
	OpInfer   = "infer"
	OpCancel  = "cancel"
	OpStatus  = "status"
	OpHealth  = "health"
	OpLease   = "lease"
	OpPause   = "pause"
)

// Ops lists every client API operation.
var Ops = []string{OpTag, OpEmbed, OpCompare, OpDetect, OpSegment, OpInfer, OpCancel, OpStatus, OpHealth, OpLease, OpPause}

// The job API's operations: ortbus.v1.job.<verb> (POST /v1/job/<verb> over HTTP).
const (
	OpJobSubmit  = "job.submit"
	OpJobStatus  = "job.status"
	OpJobCancel  = "job.cancel"
	OpJobPause   = "job.pause"
	OpJobResume  = "job.resume"
	OpJobList    = "job.list"
	OpJobResults = "job.results"
)

// IsWork reports whether op is inference work: queued, answered later, cancellable, and
// sent again by a client after a gateway died.
func IsWork(op string) bool {
	switch op {
	case OpTag, OpEmbed, OpCompare, OpDetect, OpSegment, OpInfer:
		return true
	}
	return false
}

// JobOps lists the job API's operations.
var JobOps = []string{OpJobSubmit, OpJobStatus, OpJobCancel, OpJobList, OpJobResults, OpJobPause, OpJobResume}

// The result cache's operations: ortbus.v1.cache.<verb> (POST /v1/cache/<verb>).
const (
	OpCacheStats = "cache.stats"
	OpCachePurge = "cache.purge"
)

// CacheOps lists the cache API's operations.
var CacheOps = []string{OpCacheStats, OpCachePurge}

// CachePrefix starts the subjects of the result cache's entries (package cache):
// ortbus.cache.<model>.<revision>.<owner>.<key>, each token a hex digest.
const CachePrefix = "ortbus.cache"

// The job subjects, kept in JetStream (package jobs).
const (
	JobItemPrefix   = "ortbus.job.item"
	JobResultPrefix = "ortbus.job.result"
	JobRunPrefix    = "ortbus.job.run"
)

// JobItems is the subject of a job's waiting items: ortbus.job.item.<job>.
func JobItems(job string) string { return JobItemPrefix + "." + job }

// JobResult is the subject of item n's result: ortbus.job.result.<job>.<n>.
func JobResult(job string, n int) string { return fmt.Sprintf("%s.%s.%d", JobResultPrefix, job, n) }

// JobResults matches every result of a job: ortbus.job.result.<job>.>.
func JobResults(job string) string { return JobResultPrefix + "." + job + ".>" }

// JobRun is the subject of the mark of item n's k-th run: ortbus.job.run.<job>.<n>.<k>.
func JobRun(job string, n, k int) string { return fmt.Sprintf("%s.%s.%d.%d", JobRunPrefix, job, n, k) }

// Worker control verbs: stats and drain (operators; any body, answered with a Heartbeat
// snapshot), load and unload (the gateway that supervises the worker: a model changed in
// place, codec.WorkerLoad and codec.WorkerUnload, answered with a codec.ModelStatus); and
// verdict, the reply subject of the worker's claims of items with reply_direct (the
// gateway's codec.ClaimVerdict comes there).
const (
	VerbDrain   = "drain"
	VerbStats   = "stats"
	VerbLoad    = "load"
	VerbUnload  = "unload"
	VerbVerdict = "verdict"
)

// The latency classes, highest priority first.
const (
	ClassUrgent      = "urgent"
	ClassInteractive = "interactive"
	ClassBatch       = "batch"
)

// MaxTokenLen bounds one token of a subject built or parsed here.
const MaxTokenLen = 128

// ValidateToken checks that s can stand as one subject token (a pool, class, worker id,
// op or verb): 1 to MaxTokenLen bytes of valid UTF-8, without dots, wildcards,
// whitespace or control characters.
func ValidateToken(kind, s string) error {
	if s == "" {
		return fmt.Errorf("%s name is empty", kind)
	}
	if len(s) > MaxTokenLen {
		return fmt.Errorf("%s name is %d bytes long, over the limit of %d", kind, len(s), MaxTokenLen)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s name %q is not valid UTF-8", kind, s)
	}
	for _, r := range s {
		switch {
		case r == '.':
			return fmt.Errorf("%s name %q contains a dot (a subject token cannot)", kind, s)
		case r == '*' || r == '>':
			return fmt.Errorf("%s name %q contains the wildcard %q", kind, s, r)
		case r <= ' ' || r == 0x7f || r == 0x85 || r == 0xa0 || r == 0x2028 || r == 0x2029:
			return fmt.Errorf("%s name %q contains whitespace or a control character", kind, s)
		}
	}
	return nil
}

// Infer is the work subject of a pool and class: infer.<pool>.<class>.
func Infer(pool, class string) (string, error) {
	if err := ValidateToken("pool", pool); err != nil {
		return "", err
	}
	if err := ValidateToken("class", class); err != nil {
		return "", err
	}
	return InferPrefix + "." + pool + "." + class, nil
}

// InferWorker is the work subject of one worker for a class:
// infer.<pool>.<class>.<worker>. A worker subscribes to it (no queue group) besides its
// pool's queue group, so that the gateway can send an item to the worker it chose: the
// one with a free slot (see the gateway's capacity.pickWorker).
func InferWorker(pool, class, worker string) (string, error) {
	subj, err := Infer(pool, class)
	if err != nil {
		return "", err
	}
	if err := ValidateToken("worker", worker); err != nil {
		return "", err
	}
	return subj + "." + worker, nil
}

// InferQueue is the queue group of a pool's workers: ortworker-<pool>.
func InferQueue(pool string) string { return "ortworker-" + pool }

// API is the client API subject of an op: ortbus.v1.<op>.
func API(op string) (string, error) {
	for _, j := range append(slices.Clip(JobOps), CacheOps...) { // two tokens: job.<verb>, cache.<verb>
		if op == j {
			return APIPrefix + "." + op, nil
		}
	}
	if err := ValidateToken("op", op); err != nil {
		return "", err
	}
	return APIPrefix + "." + op, nil
}

// Heartbeat is the heartbeat subject of a worker: ortbus.hb.<pool>.<worker>.
func Heartbeat(pool, worker string) (string, error) {
	if err := ValidateToken("pool", pool); err != nil {
		return "", err
	}
	if err := ValidateToken("worker", worker); err != nil {
		return "", err
	}
	return HBPrefix + "." + pool + "." + worker, nil
}

// Worker is a control subject of one worker: ortbus.worker.<worker>.<verb>.
func Worker(worker, verb string) (string, error) {
	if err := ValidateToken("worker", worker); err != nil {
		return "", err
	}
	if err := ValidateToken("verb", verb); err != nil {
		return "", err
	}
	return WorkerPrefix + "." + worker + "." + verb, nil
}

// Claim is the subject prefix on which a gateway hears claims of the work it dispatched
// (it subscribes to Claim(gw)+".>"); a work item carries it as claim_to.
func Claim(gateway string) (string, error) {
	if err := ValidateToken("gateway", gateway); err != nil {
		return "", err
	}
	return ClaimPrefix + "." + gateway, nil
}

// ClaimFrom is the subject a worker of pool publishes its claim on, given the claim_to
// of a work item: <claim_to>.<pool>.<worker>. The claim_to must be a gateway's claim
// prefix (ortbus.claim.<gateway>), so that a forged work item cannot make a worker
// publish anywhere else; the pool and worker tokens tie the claim to its sender (the
// cluster permissions let each pool's workers publish only ortbus.claim.*.<pool>.*).
func ClaimFrom(claimTo, pool, worker string) (string, error) {
	t := strings.Split(claimTo, ".")
	if len(t) != 3 || t[0]+"."+t[1] != ClaimPrefix {
		return "", fmt.Errorf("claim_to %q is not a claim subject (%s.<gateway>)", claimTo, ClaimPrefix)
	}
	if err := ValidateToken("gateway", t[2]); err != nil {
		return "", err
	}
	if err := ValidateToken("pool", pool); err != nil {
		return "", err
	}
	if err := ValidateToken("worker", worker); err != nil {
		return "", err
	}
	return claimTo + "." + pool + "." + worker, nil
}

// InboxOwner is the part of a reply subject that names the connection it belongs to:
// every token but the last. NATS clients (nats.go, nats.js) answer their requests on
// <inbox prefix>.<connection nuid>.<token>, so two requests of one connection share it,
// and with per-user inbox prefixes and subscribe permissions no other user can receive
// on it. Empty for a subject of one token (or none).
func InboxOwner(reply string) string {
	i := strings.LastIndexByte(reply, '.')
	if i <= 0 {
		return ""
	}
	return reply[:i]
}

// MaxReplyLen bounds a reply subject that ortbus publishes to on a requester's behalf.
// nats.go's inboxes (_INBOX.<22-byte nuid>.<token>), a custom inbox prefix and a service
// import's mapped replies (_R_.<...>) are far shorter; a longer one is not a reply
// subject of any client, and an answer published to 4 KB of subject would exceed the
// server's control line and close the publisher's connection.
const MaxReplyLen = 256

// DefaultReplyPrefixes are the reply destinations accepted when the config names none
// ([nats] reply_prefixes): nats.go's and nats.js's default _INBOX, the inbox prefixes of
// the roles of deploy/cluster/permissions.conf, and _R_, where nats-server maps the
// replies of a request that crossed a service import from another account.
var DefaultReplyPrefixes = []string{"_INBOX", "_INBOX_client", "_INBOX_ops", "_INBOX_gateway", ImportReplyPrefix}

// ImportReplyPrefix is where nats-server maps the reply subject of a request that crossed
// a service import: _R_.<prefix>.<n>. The prefix is the exporting account's on the
// requester's server, shared by every importing account, so it names no requester; and
// nats-server refuses a client's publish whose reply subject is under it, so such a reply
// can be answered but not handed on as a reply subject.
const ImportReplyPrefix = "_R_"

// IsImportReply reports whether reply is under ImportReplyPrefix.
func IsImportReply(reply string) bool { return strings.HasPrefix(reply, ImportReplyPrefix+".") }

// CheckReply reports whether reply is a subject ortbus may publish an answer to on a
// requester's behalf (the rules of docs/PROTOCOL.md, "Reply subjects"):
//
//  1. at most MaxReplyLen bytes;
//  2. every token valid (ValidateToken: no empty token, no wildcard, no whitespace or
//     control character, valid UTF-8);
//  3. under one of prefixes (each a whole number of tokens, e.g. "_INBOX" or
//     "_INBOX_client"), with at least one token after it.
//
// Anything else — an API, JetStream, $SYS or ortbus subject — is no reply destination:
// a requester could otherwise make ortbus publish an answer wherever it likes (a purge
// request of JetStream's API, the operators' cancel) with ortbus's own rights.
func CheckReply(reply string, prefixes []string) error {
	if len(reply) > MaxReplyLen {
		return fmt.Errorf("reply subject is %d bytes long, over the limit of %d", len(reply), MaxReplyLen)
	}
	if reply == "" {
		return fmt.Errorf("reply subject is empty")
	}
	for t := range strings.SplitSeq(reply, ".") {
		if err := ValidateToken("reply token", t); err != nil {
			return err
		}
	}
	for _, p := range prefixes {
		if p != "" && len(reply) > len(p)+1 && reply[len(p)] == '.' && strings.HasPrefix(reply, p) {
			return nil
		}
	}
	return fmt.Errorf("reply subject %q is not under a reply prefix (%s)", reply, strings.Join(prefixes, ", "))
}

// GatePrefix starts the compute gates' subjects; GateAll matches every gate.
const (
	GatePrefix = "ortbus.gate"
	GateAll    = GatePrefix + ".>"
)

// Gate is the subject of a device's compute gate as gateway decides it:
// ortbus.gate.<gateway>.<device> (gateway/gate.go). Only gateways may publish it. A
// device name is not always a token (gpu.intel:0): its dots, wildcards, blanks and
// control characters become "_" there. Two devices may so share a subject; the gate's
// body names its device, which a receiver checks.
func Gate(gateway, device string) (string, error) {
	if err := ValidateToken("gateway", gateway); err != nil {
		return "", err
	}
	tok := strings.Map(func(r rune) rune {
		if r == '.' || r == '*' || r == '>' || r <= ' ' || r == 0x7f || r == 0x85 || r == 0xa0 || r == 0x2028 || r == 0x2029 {
			return '_'
		}
		return r
	}, device)
	if err := ValidateToken("device", tok); err != nil {
		return "", err
	}
	return GatePrefix + "." + gateway + "." + tok, nil
}

// GatewayBeat is the heartbeat subject of a gateway: ortbus.gw.<gateway>.hb.
func GatewayBeat(gateway string) (string, error) {
	if err := ValidateToken("gateway", gateway); err != nil {
		return "", err
	}
	return GWPrefix + "." + gateway + ".hb", nil
}

// Parsed is a subject taken apart by Parse.
type Parsed struct {
	Kind   Kind
	Pool   string // infer, heartbeat
	Class  string // infer
	Op     string // api
	Worker string // heartbeat, worker control, claim, a worker's own infer; the gateway of a gateway subject
	Verb   string // worker control
	// Gateway is the gateway of a claim subject.
	Gateway string
}

// Kind says which family a subject belongs to.
type Kind int

// The subject families.
const (
	KindUnknown Kind = iota
	KindInfer
	KindAPI
	KindHeartbeat
	KindCancel
	KindWorker
	KindClaim
	KindGateway
)

// Parse takes an ortbus subject apart, validating each token.
func Parse(subject string) (Parsed, error) {
	t := strings.Split(subject, ".")
	bad := func(why string) (Parsed, error) {
		return Parsed{}, fmt.Errorf("subject %q: %s", subject, why)
	}
	check := func(p Parsed, pairs ...string) (Parsed, error) {
		for i := 0; i < len(pairs); i += 2 {
			if err := ValidateToken(pairs[i], pairs[i+1]); err != nil {
				return bad(err.Error())
			}
		}
		return p, nil
	}
	switch {
	case len(t) == 3 && t[0] == InferPrefix:
		return check(Parsed{Kind: KindInfer, Pool: t[1], Class: t[2]}, "pool", t[1], "class", t[2])
	case len(t) == 4 && t[0] == InferPrefix:
		return check(Parsed{Kind: KindInfer, Pool: t[1], Class: t[2], Worker: t[3]}, "pool", t[1], "class", t[2], "worker", t[3])
	case len(t) == 3 && t[0] == "ortbus" && t[1] == "v1":
		return check(Parsed{Kind: KindAPI, Op: t[2]}, "op", t[2])
	case len(t) == 4 && t[0] == "ortbus" && t[1] == "v1" && t[2] == "job":
		return check(Parsed{Kind: KindAPI, Op: "job." + t[3]}, "op", t[3])
	case len(t) == 4 && t[0] == "ortbus" && t[1] == "v1" && t[2] == "cache":
		return check(Parsed{Kind: KindAPI, Op: "cache." + t[3]}, "op", t[3])
	case len(t) == 4 && t[0] == "ortbus" && t[1] == "hb":
		return check(Parsed{Kind: KindHeartbeat, Pool: t[2], Worker: t[3]}, "pool", t[2], "worker", t[3])
	case subject == Cancel:
		return Parsed{Kind: KindCancel}, nil
	case len(t) == 4 && t[0] == "ortbus" && t[1] == "worker":
		return check(Parsed{Kind: KindWorker, Worker: t[2], Verb: t[3]}, "worker", t[2], "verb", t[3])
	case len(t) == 4 && t[0] == "ortbus" && t[1] == "gw" && (t[3] == "hb" || t[3] == "log"):
		return check(Parsed{Kind: KindGateway, Worker: t[2], Verb: t[3]}, "gateway", t[2])
	case len(t) == 5 && t[0] == "ortbus" && t[1] == "claim":
		return check(Parsed{Kind: KindClaim, Gateway: t[2], Pool: t[3], Worker: t[4]}, "gateway", t[2], "pool", t[3], "worker", t[4])
	}
	return bad("not an ortbus subject")
}
