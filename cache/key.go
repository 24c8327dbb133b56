package cache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// Key names one answer: see the package doc.
type Key struct {
	Owner, Op, Model, Revision string
	// Options are the answer-changing options, encoded (OptionsOf).
	Options []byte
	// Content is the SHA-256 of the image file's bytes.
	Content [32]byte
}

// OptionsOf encodes the options of req that change op's answer: tag's thresholds,
// detect's conf and iou; nothing for embed. The encoding is msgpack of a fixed struct, so
// equal options encode equally.
func OptionsOf(op string, req *codec.Request) []byte {
	var v any
	switch op {
	case subjects.OpTag:
		v = struct {
			T *codec.Thresholds `msgpack:"t"`
		}{req.Thresholds}
	case subjects.OpDetect:
		v = struct {
			C *float64 `msgpack:"c"`
			I *float64 `msgpack:"i"`
		}{req.Conf, req.IoU}
	default:
		return nil
	}
	b, _ := codec.Marshal(v)
	return b
}

// Digest is the key's SHA-256, as hex: the last token of its subject, and what an entry
// carries to be recognised.
func (k Key) Digest() string {
	d := sha256.New()
	fmt.Fprintf(d, "ortbus cache key 1\x00%d:%s\x00%d:%s\x00%d:%s\x00%d:%s\x00%d:", len(k.Owner), k.Owner, len(k.Op), k.Op,
		len(k.Model), k.Model, len(k.Revision), k.Revision, len(k.Options))
	d.Write(k.Options)
	d.Write(k.Content[:])
	return hex.EncodeToString(d.Sum(nil))
}

// token is 16 hex digits of the hash of s in its role: a subject token any string maps to.
func token(role, s string) string {
	sum := sha256.Sum256([]byte(role + "\x00" + s))
	return hex.EncodeToString(sum[:8])
}

// ModelToken, OwnerToken and RevisionToken are the subject tokens of a model's name, an
// owner and a revision.
func ModelToken(model string) string  { return token("model", model) }
func OwnerToken(owner string) string  { return token("owner", owner) }
func RevisionToken(rev string) string { return token("revision", rev) }

// Subject is the entry's subject: ortbus.cache.<model>.<revision>.<owner>.<digest>.
func (k Key) Subject() string {
	return subjects.CachePrefix + "." + ModelToken(k.Model) + "." + RevisionToken(k.Revision) + "." + OwnerToken(k.Owner) + "." + k.Digest()
}

// Filter is the subject filter of the entries of model (every model when "") of owner
// (with all, every owner's).
func Filter(model, owner string, all bool) string {
	m, o := "*", OwnerToken(owner)
	if model != "" {
		m = ModelToken(model)
	}
	if all {
		if model == "" {
			return subjects.CachePrefix + ".>"
		}
		return subjects.CachePrefix + "." + m + ".>"
	}
	return subjects.CachePrefix + "." + m + ".*." + o + ".>"
}

// RevisionFilter is the subject filter of model's entries of revision rev, every owner's.
func RevisionFilter(model, rev string) string {
	return subjects.CachePrefix + "." + ModelToken(model) + "." + RevisionToken(rev) + ".>"
}

// entry is a cached answer as stored: the key's digest (so that an entry is only ever
// taken for its own key), when it was written, the op's reply (msgpack, as the worker
// sent it, its id cleared) and the SHA-256 of the reply.
type entry struct {
	V       int    `msgpack:"v"`
	Digest  string `msgpack:"k"`
	Created int64  `msgpack:"t"` // Unix ms
	Body    []byte `msgpack:"b"`
	Sum     []byte `msgpack:"s"`
}

const entryVersion = 1

func encodeEntry(digest string, created int64, body []byte) ([]byte, error) {
	sum := sha256.Sum256(body)
	return codec.Marshal(&entry{V: entryVersion, Digest: digest, Created: created, Body: body, Sum: sum[:]})
}

// decodeEntry reads an entry stored under digest; any fault (not msgpack, another
// version, another key, a checksum that does not match: a truncated or corrupt entry) is
// an error, which the caller counts as a miss.
func decodeEntry(data []byte, digest string) (*entry, error) {
	var e entry
	if err := codec.Unmarshal(data, &e); err != nil {
		return nil, err
	}
	if e.V != entryVersion || e.Digest != digest || len(e.Body) == 0 {
		return nil, fmt.Errorf("cache entry: wrong version, key or empty")
	}
	sum := sha256.Sum256(e.Body)
	if !bytes.Equal(sum[:], e.Sum) {
		return nil, fmt.Errorf("cache entry: checksum mismatch")
	}
	return &e, nil
}
