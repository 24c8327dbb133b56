package jobs

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/ortbus/ortbus/codec"
)

// Job ids are per owner, as request ids are (the gateway's identity rules): the same id
// in two accounts is two jobs, and no owner can see, watch, cancel, take or learn of
// another's job by naming its id. The rules:
//
//   - A job is kept under its key (the record's key in the bucket, the subjects of its
//     items, results and run marks, its items' request ids job:<key>:<n>). The local
//     owner "" (operators; every requester with gateway.identity = "local") keeps its
//     ids as their own keys; an account's id is kept under accountKeyPrefix and 40 hex
//     digits of the SHA-256 of the account and its id (Key), so that two accounts' ids never
//     meet and none can name, compute or take another's key.
//   - An account names its jobs by its own ids and is answered with them (Record.Name); the
//     local owner, who reaches every job, names and sees an account's job by its key.
//   - The local owner may not submit under an id of an account key's form (reserved), so
//     that no key an account will use can be taken before the account uses it.

// accountKeyPrefix starts the key of every account's job; accountKeyHex is the number of hex
// digits after it.
const (
	accountKeyPrefix = "t"
	accountKeyHex    = 40
)

// Key is the key of owner's job id (the rules above).
func Key(owner, id string) string {
	if owner == "" {
		return id
	}
	sum := sha256.Sum256([]byte("ortbus job\x00" + owner + "\x00" + id))
	return accountKeyPrefix + hex.EncodeToString(sum[:])[:accountKeyHex]
}

// accountKeyForm reports whether id has the form of an account's key.
func accountKeyForm(id string) bool {
	if len(id) != len(accountKeyPrefix)+accountKeyHex || id[:len(accountKeyPrefix)] != accountKeyPrefix {
		return false
	}
	for _, c := range id[len(accountKeyPrefix):] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// checkOwnID refuses an id the local owner may not submit under: one of an account key's
// form (bad_request).
func checkOwnID(owner, id string) *codec.Error {
	if owner == "" && accountKeyForm(id) {
		return codec.Errorf(codec.CodeBadRequest, "job id %s has the form of the ids kept for applications' jobs (t and 40 hex digits); choose another", id).With("field", "job")
	}
	return nil
}

// viewID is the id under which viewer sees rec: its owner's own id for its owner, the key
// for the local owner looking at an account's job.
func viewID(rec *Record, viewer string) string {
	if rec.Name != "" && viewer == rec.Owner {
		return rec.Name
	}
	return rec.Job
}
