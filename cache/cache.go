// Package cache is the gateway's content-addressed result cache: the answer of a tag,
// embed or detect request, kept in JetStream and served again for the same bytes.
//
// The key of an answer (Key) is the SHA-256 of: its owner (the account; "" the local
// owner), the op, the model's name and revision (Revision: a hash of the model's kind,
// its settings that change answers, and the bytes of each of its files), the options that
// change the answer (tag: thresholds; detect: conf, iou; embed: none), and the SHA-256 of
// the image file's bytes. Nothing else: the path, the request id, the class, the pool, the
// device or the timeout never change an answer.
//
// Storage (Store): one JetStream stream, ORTBUS_CACHE, one message per subject
// ortbus.cache.<m>.<r>.<o>.<key> (model, revision and owner as 16 hex digits of their
// hash, key the whole digest), so one subject filter purges a model's entries, a
// revision's or an owner's. Entries carry a checksum: one that does not decode, whose key
// or checksum does not match, is a miss (counted corrupt), never an error.
//
// Eviction: the stream is bounded by max_bytes with discard-new; a write it refuses for
// room makes this gateway purge the oldest written entries (lowest stream sequences)
// until about a fifth of the bound is free, then write again. So eviction is first in,
// first out by write time; each entry removed counts as an eviction.
//
// Files (Hasher): the image's bytes are hashed streaming, at most once per file version:
// in front of the content key sits a stat key (path, size, mtime, ctime, inode, device).
// The rule for a file rewritten in place with the same size and mtime: its ctime changes
// (the kernel sets it on every write and on every utimes; no user can set it back), so the
// stat key differs and the file is hashed again. A stat key is trusted only when the file
// was hashed more than Racy (2 s) after its last mtime or ctime: a file changed within the
// timestamp granularity of its filesystem right after being hashed could keep every
// timestamp (git's racy-index rule), so such a file is hashed again next time. A file whose
// stat changes while it is hashed is not cached; and an answer is stored only if the file's
// stat key is still the one its hash was taken under once the answer is back, so an
// answer computed from other bytes than those hashed is never stored.
package cache

import "github.com/ortbus/ortbus/subjects"

// Cacheable reports whether op's answers are cached: the ops whose answer is a function
// of one image file's bytes (segment writes a file, compare and infer take their inputs
// inline).
func Cacheable(op string) bool {
	switch op {
	case subjects.OpTag, subjects.OpEmbed, subjects.OpDetect:
		return true
	}
	return false
}
