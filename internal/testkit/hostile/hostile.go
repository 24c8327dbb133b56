// Package hostile generates hostile message bodies for the ortbus bus, deterministically
// from a seed: given one VALID message (a value of package codec, or its msgpack or JSON
// bytes), it yields a stream of named mutations — truncations, length headers that lie,
// deep nesting, invalid UTF-8, wrong types, extreme numbers, forged identities, hostile
// paths, huge and empty bodies, the wrong Content-Type, duplicate and unknown keys, and
// random damage — each as the bytes to send and whether to send them as JSON.
//
// Per-field mutations walk the map of the valid encoding (nested maps and the first
// element of arrays too) and replace one value at a time with raw msgpack written by
// hand, since a library encoder never writes a header that lies. The rest of the message
// is kept byte for byte, so a lying length header swallows whatever follows it.
//
// The tests of package test send these to every subject and HTTP route of a running
// system (test/hostile_test.go); nothing here touches the network.
package hostile

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/ortbus/ortbus/codec"
)

// Category groups mutations by the kind of damage.
type Category string

// The categories, in the order the generator emits them.
const (
	CatEmpty       Category = "empty"        // empty and trivially small bodies
	CatContentType Category = "content_type" // JSON sent as msgpack and msgpack sent as JSON
	CatTruncate    Category = "truncate"     // the valid message cut at an offset
	CatTrailing    Category = "trailing"     // the valid message followed by more bytes
	CatLength      Category = "length"       // length headers at and near their maximum
	CatNesting     Category = "nesting"      // arrays and maps nested Options.Depth deep
	CatUTF8        Category = "utf8"         // invalid UTF-8 in strings and keys, lone surrogates
	CatType        Category = "type"         // a field of the wrong type (nil, bool, map, ext, timestamp -1, ...)
	CatNumber      Category = "number"       // extreme numbers: int64 min/max, uint64 max, -1, NaN, ±Inf, 1e308
	CatIdentity    Category = "identity"     // ids that are not valid subject tokens ('.', '*', '>', spaces, control chars, 10 KB)
	CatForged      Category = "forged"       // identities another process owns (Options.Forge)
	CatPath        Category = "path"         // hostile paths: relative, '..', outside the roots, NUL bytes, Options.Paths
	CatHuge        Category = "huge"         // valid-looking bodies up to Options.MaxBody
	CatDupKey      Category = "dupkey"       // a key present twice
	CatUnknown     Category = "unknown"      // unknown fields, keys that are not strings
	CatMissing     Category = "missing"      // a field left out
	CatRandom      Category = "random"       // seeded random damage of the valid bytes
)

// Categories lists every category.
var Categories = []Category{
	CatEmpty, CatContentType, CatTruncate, CatTrailing, CatLength, CatNesting, CatUTF8,
	CatType, CatNumber, CatIdentity, CatForged, CatPath, CatHuge, CatDupKey, CatUnknown,
	CatMissing, CatRandom,
}

// Mutation is one hostile body.
type Mutation struct {
	// Name is unique within one generator's stream: category/detail[@field][+json].
	Name     string
	Category Category
	// Field is the field path the mutation targets ("" for the whole message).
	Field string
	Body  []byte
	// JSON says to send Body with the header Content-Type: application/json.
	JSON bool
}

// Options tune a generator. The zero value is usable.
type Options struct {
	// Seed seeds the random mutations (and nothing else: the rest is fixed).
	Seed uint64
	// MaxBody is the largest body produced (the huge category). Default 1 MiB.
	MaxBody int
	// Depth is how deep the nesting category nests. Default 100000.
	Depth int
	// Random is how many random mutations to produce. Default 64.
	Random int
	// Truncations: a message of at most this many bytes is cut at every offset, a longer
	// one at this many offsets (its first and last bytes, and seeded ones). Default 64.
	Truncations int
	// FieldDepth is how deep nested maps and arrays are walked for per-field mutations
	// (1 = top-level fields only). Default 2.
	FieldDepth int
	// Forge maps a field name (a leaf key such as "worker", "pool", "id") to identities to
	// put there: another worker's id, another pool, a request id someone else owns.
	Forge map[string][]string
	// Paths are extra values for path fields (an existing file, a path outside the allowed
	// roots, through a symlink, ...), besides the built-in hostile paths.
	Paths []string
	// IDFields are the leaf names of identity fields; default DefaultIDFields.
	IDFields []string
	// NoJSON leaves out the JSON variants; NoMsgpack the msgpack ones.
	NoJSON, NoMsgpack bool
}

// DefaultIDFields are the identity fields of the ortbus messages: subject tokens, ids,
// names that end up in logs, metrics labels and subjects.
var DefaultIDFields = []string{"id", "worker", "pool", "gateway", "class", "model", "op", "claim_to", "reply", "device", "state", "host", "runtime", "ep", "name", "kind", "job"}

// MsgpackBytes is a sample given as msgpack bytes.
type MsgpackBytes []byte

// JSONBytes is a sample given as JSON bytes.
type JSONBytes []byte

// Generator yields the mutations of one sample.
type Generator struct {
	o  Options
	mp []byte // the valid msgpack encoding
	js []byte // the valid JSON encoding
}

// New prepares a generator for sample: a Go value (encoded with codec.Marshal and as
// JSON), MsgpackBytes, JSONBytes, or []byte (JSON if it starts with '{' or '[', else
// msgpack). The sample must encode as a map/object.
func New(sample any, o Options) (*Generator, error) {
	if o.MaxBody <= 0 {
		o.MaxBody = 1 << 20
	}
	if o.Depth <= 0 {
		o.Depth = 100000
	}
	if o.Random <= 0 {
		o.Random = 64
	}
	if o.Truncations <= 0 {
		o.Truncations = 64
	}
	if o.FieldDepth <= 0 {
		o.FieldDepth = 2
	}
	if o.IDFields == nil {
		o.IDFields = DefaultIDFields
	}
	g := &Generator{o: o}
	var err error
	switch s := sample.(type) {
	case MsgpackBytes:
		g.mp = slices.Clone(s)
		g.js, err = msgpackToJSON(s)
	case JSONBytes:
		g.js = slices.Clone(s)
		g.mp, err = jsonToMsgpack(s)
	case []byte:
		t := bytes.TrimSpace(s)
		if len(t) > 0 && (t[0] == '{' || t[0] == '[') {
			return New(JSONBytes(s), o)
		}
		return New(MsgpackBytes(s), o)
	default:
		if g.mp, err = codec.Marshal(sample); err != nil {
			return nil, err
		}
		g.js, err = codec.Encode(sample, true)
	}
	if err != nil {
		return nil, fmt.Errorf("hostile: sample: %w", err)
	}
	if _, ok, err := splitMap(g.mp); !ok || err != nil {
		return nil, fmt.Errorf("hostile: sample: %w (%v)", errNotObject, err)
	}
	if _, ok, err := splitObject(g.js); !ok || err != nil {
		return nil, fmt.Errorf("hostile: sample JSON: %w (%v)", errNotObject, err)
	}
	return g, nil
}

// Generate returns every mutation of sample at once.
func Generate(sample any, o Options) ([]Mutation, error) {
	g, err := New(sample, o)
	if err != nil {
		return nil, err
	}
	return slices.Collect(g.All()), nil
}

// Valid returns the valid encodings of the sample.
func (g *Generator) Valid() (msgpackBody, jsonBody []byte) { return g.mp, g.js }

// All yields every mutation, in a fixed order for a given sample and options.
func (g *Generator) All() iter.Seq[Mutation] { return g.Select(nil) }

// Select yields the mutations of All for which keep returns true (all of them when keep
// is nil), in All's order and with the same names and bodies. keep is asked before a
// mutation's body is built, with the mutation's index in All's stream, its name and its
// category: a consumer that sends only a sample of the stream does not pay for the bodies
// it drops (the huge and deep ones are up to MaxBody bytes each).
func (g *Generator) Select(keep func(i int, name string, cat Category) bool) iter.Seq[Mutation] {
	return func(yield func(Mutation) bool) {
		e := &emitter{yield: yield, keep: keep, seen: map[string]int{}, o: g.o}
		for _, section := range []func(*emitter){
			g.empty, g.contentType, g.truncate, g.trailing, g.topLength, g.nesting,
			g.fields, g.huge, g.unknown, g.random,
		} {
			section(e)
			if e.stopped {
				return
			}
		}
	}
}

// emitter hands mutations to the consumer, making names unique.
type emitter struct {
	yield   func(Mutation) bool
	keep    func(i int, name string, cat Category) bool // nil: every mutation
	n       int                                         // mutations of All's stream so far
	seen    map[string]int
	stopped bool
	o       Options
}

func (e *emitter) emit(cat Category, name, field string, body []byte, asJSON bool) bool {
	return e.emitLazy(cat, name, field, func() []byte { return body }, asJSON)
}

// emitLazy is emit with the body built by build, only when the consumer keeps the
// mutation (Select).
func (e *emitter) emitLazy(cat Category, name, field string, build func() []byte, asJSON bool) bool {
	if e.stopped {
		return false
	}
	if asJSON && e.o.NoJSON || !asJSON && e.o.NoMsgpack {
		return true
	}
	full := string(cat) + "/" + name
	if field != "" {
		full += "@" + field
	}
	if asJSON {
		full += "+json"
	}
	if n := e.seen[full]; n > 0 {
		e.seen[full] = n + 1
		full += "#" + strconv.Itoa(n+1)
	} else {
		e.seen[full] = 1
	}
	i := e.n
	e.n++
	if e.keep != nil && !e.keep(i, full, cat) {
		return true
	}
	if !e.yield(Mutation{Name: full, Category: cat, Field: field, Body: build(), JSON: asJSON}) {
		e.stopped = true
	}
	return !e.stopped
}

// ---- whole-message sections ----

func (g *Generator) empty(e *emitter) {
	for _, m := range []named{
		{"zero-bytes", nil}, {"nil", []byte{mpNil}}, {"empty-map", []byte{0x80}}, {"empty-array", []byte{0x90}},
		{"empty-str", []byte{0xa0}}, {"zero", []byte{0x00}}, {"true", []byte{mpTrue}}, {"nul-byte", []byte{0}},
		{"space", []byte(" ")}, {"reserved-c1", []byte{0xc1}}, {"never-used-ff", []byte{0xff}},
	} {
		if !e.emit(CatEmpty, m.name, "", m.b, false) {
			return
		}
	}
	for _, m := range []named{
		{"zero-bytes", nil}, {"null", []byte("null")}, {"empty-object", []byte("{}")}, {"empty-array", []byte("[]")},
		{"empty-string", []byte(`""`)}, {"zero", []byte("0")}, {"whitespace", []byte(" \n\t ")}, {"nul-byte", []byte{0}},
		{"bom", []byte("\xef\xbb\xbf{}")}, {"true", []byte("true")},
	} {
		if !e.emit(CatEmpty, m.name, "", m.b, true) {
			return
		}
	}
}

func (g *Generator) contentType(e *emitter) {
	// The JSON encoding read as msgpack, the msgpack encoding read as JSON.
	e.emit(CatContentType, "json-body-as-msgpack", "", g.js, false)
	e.emit(CatContentType, "msgpack-body-as-json", "", g.mp, true)
}

// offsets returns the offsets at which a message of n bytes is cut: every one when
// short, else the first and last Truncations/4 and seeded ones in between.
func (g *Generator) offsets(n int, rng *rand.Rand) []int {
	k := g.o.Truncations
	if n <= k {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	set := map[int]bool{}
	for i := 0; i < k/4; i++ {
		set[i] = true
		set[n-1-i] = true
	}
	for len(set) < k {
		set[1+rng.IntN(n-1)] = true
	}
	out := make([]int, 0, len(set))
	for i := range set {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

func (g *Generator) truncate(e *emitter) {
	rng := rand.New(rand.NewPCG(g.o.Seed, 0x7472756e63617465))
	for _, at := range g.offsets(len(g.mp), rng) {
		if !e.emit(CatTruncate, strconv.Itoa(at), "", slices.Clone(g.mp[:at]), false) {
			return
		}
	}
	for _, at := range g.offsets(len(g.js), rng) {
		if !e.emit(CatTruncate, strconv.Itoa(at), "", slices.Clone(g.js[:at]), true) {
			return
		}
	}
}

func (g *Generator) trailing(e *emitter) {
	garbage := bytes.Repeat([]byte{0xc1, 0xff, 0x00, 0xdd}, 256)
	e.emit(CatTrailing, "nil", "", join(g.mp, []byte{mpNil}), false)
	e.emit(CatTrailing, "twice", "", join(g.mp, g.mp), false)
	e.emit(CatTrailing, "garbage-1k", "", join(g.mp, garbage), false)
	e.emit(CatTrailing, "array32-max", "", join(g.mp, []byte{mpArray32, 0xff, 0xff, 0xff, 0xff}), false)
	e.emit(CatTrailing, "twice", "", join(g.js, g.js), true)
	e.emit(CatTrailing, "garbage", "", join(g.js, []byte("x\x00\xff")), true)
	e.emit(CatTrailing, "comma", "", join(g.js, []byte(",")), true)
}

// topLength puts every lying header at the top level: alone, followed by the valid
// message, and in place of the message's own map header.
func (g *Generator) topLength(e *emitter) {
	entries, _, _ := splitMap(g.mp)
	body := g.mp[len(mapHeader(len(entries))):]
	if len(mapHeader(len(entries))) > len(g.mp) || !bytes.HasPrefix(g.mp, mapHeader(len(entries))) {
		body = nil // a sample with a non-minimal header: skip the replaced-header variant
	}
	for _, h := range lyingHeaders() {
		if !e.emit(CatLength, h.name+"/alone", "", h.b, false) {
			return
		}
		e.emit(CatLength, h.name+"/before-message", "", join(h.b, g.mp), false)
		if body != nil {
			e.emit(CatLength, h.name+"/as-map-header", "", join(h.b, body), false)
		}
	}
	// The map's own count, lying.
	for _, n := range []uint32{math.MaxUint32, math.MaxUint32 - 1, uint32(len(entries) + 1), 1 << 20} {
		if body != nil {
			e.emit(CatLength, fmt.Sprintf("map32-count-%d", n), "", join(be32(mpMap32, n), body), false)
		}
	}
}

// nesting writes Options.Depth levels of arrays and maps, msgpack and JSON.
func (g *Generator) nesting(e *emitter) {
	d := g.o.Depth
	deep := func(f func(int) []byte) func() []byte { return func() []byte { return f(d) } }
	e.emitLazy(CatNesting, fmt.Sprintf("fixarray-%d", d), "", deep(deepArray), false)
	e.emitLazy(CatNesting, fmt.Sprintf("fixmap-%d", d), "", deep(deepMap), false)
	e.emitLazy(CatNesting, fmt.Sprintf("array32-%d", d), "", deep(deepArray32), false)
	e.emitLazy(CatNesting, fmt.Sprintf("map-of-arrays-%d", d), "", deep(deepMixed), false)
	e.emitLazy(CatNesting, fmt.Sprintf("unclosed-array-%d", d), "", func() []byte { return bytes.Repeat([]byte{0x91}, d) }, false)
	e.emitLazy(CatNesting, fmt.Sprintf("array-%d", d), "", deep(deepJSONArray), true)
	e.emitLazy(CatNesting, fmt.Sprintf("object-%d", d), "", deep(deepJSONObject), true)
	e.emitLazy(CatNesting, fmt.Sprintf("unclosed-array-%d", d), "", func() []byte { return bytes.Repeat([]byte("["), d) }, true)
}

func deepArray(d int) []byte {
	b := bytes.Repeat([]byte{0x91}, d)
	return append(b, mpNil)
}

func deepArray32(d int) []byte {
	b := make([]byte, 0, 5*d+1)
	for i := 0; i < d; i++ {
		b = append(b, mpArray32, 0, 0, 0, 1)
	}
	return append(b, mpNil)
}

func deepMap(d int) []byte {
	b := bytes.Repeat([]byte{0x81, 0xa1, 'a'}, d)
	return append(b, mpNil)
}

func deepMixed(d int) []byte {
	b := bytes.Repeat([]byte{0x81, 0xa1, 'a', 0x91}, d/2)
	return append(b, mpNil)
}

func deepJSONArray(d int) []byte {
	return join(bytes.Repeat([]byte("["), d), bytes.Repeat([]byte("]"), d))
}

func deepJSONObject(d int) []byte {
	return join(bytes.Repeat([]byte(`{"a":`), d), []byte("null"), bytes.Repeat([]byte("}"), d))
}

// ---- per-field section ----

// invalidUTF8 are strings that are not UTF-8 (or that are, but hold a NUL).
var invalidUTF8 = []named{
	{"ff", []byte("\xff")},
	{"c3-28", []byte("\xc3\x28")},
	{"overlong-slash", []byte("\xc0\xaf")},
	{"overlong-3byte", []byte("\xe0\x80\xaf")},
	{"overlong-nul", []byte("\xc0\x80")},
	{"surrogate-d800", []byte("\xed\xa0\x80")},
	{"above-10ffff", []byte("\xf4\x90\x80\x80")},
	{"truncated-euro", []byte("\xe2\x82")},
	{"nul-inside", []byte("a\x00b")},
	{"mixed-tail", []byte("valid-\xfe\xff")},
}

// jsonBadStrings are JSON string literals that decode to invalid text: lone surrogates,
// raw invalid bytes, escaped NUL.
var jsonBadStrings = []named{
	{"lone-udfff", []byte(`"\udfff"`)},
	{"lone-ud800", []byte(`"\ud800"`)},
	{"reversed-pair", []byte(`"\udc00\ud800"`)},
	{"raw-ff", []byte("\"\xff\"")},
	{"raw-overlong", []byte("\"\xc0\xaf\"")},
	{"escaped-nul", []byte(`"a\u0000b"`)},
	{"raw-control", []byte("\"a\x01b\"")},
}

// wrongTypes are values of every msgpack type, for fields of another one.
func wrongTypes() []named {
	return []named{
		{"nil", []byte{mpNil}},
		{"true", []byte{mpTrue}},
		{"false", []byte{mpFalse}},
		{"int-0", []byte{0x00}},
		{"str", mpStr("x")},
		{"empty-map", []byte{0x80}},
		{"map", []byte{0x81, 0xa1, 'a', 0x01}},
		{"empty-array", []byte{0x90}},
		{"array", []byte{0x92, 0x01, 0xa1, 'x'}},
		{"bin", mpBin([]byte{1, 2, 3})},
		{"float", mpF64(1.5)},
		{"ext8", []byte{mpExt8, 2, 0x05, 0xaa, 0xbb}},
		{"fixext4", []byte{mpFixExt4, 0x05, 1, 2, 3, 4}},
		{"timestamp32", []byte{mpFixExt4, 0xff, 0, 0, 0, 0}},
		{"timestamp64-bad-nsec", []byte{mpFixExt8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"timestamp96-min", join([]byte{mpExt8, 12, 0xff, 0xff, 0xff, 0xff, 0xff}, be64(0, 1<<63)[1:])},
		{"timestamp-len3", []byte{mpExt8, 3, 0xff, 0, 0, 0}},
		{"map-int-key", []byte{0x81, 0x01, 0x01}},
	}
}

var jsonWrongTypes = []named{
	{"null", []byte("null")}, {"true", []byte("true")}, {"zero", []byte("0")}, {"string", []byte(`"x"`)},
	{"empty-object", []byte("{}")}, {"object", []byte(`{"a":1}`)}, {"empty-array", []byte("[]")},
	{"array", []byte(`[1,"x",null]`)}, {"float", []byte("1.5")},
}

// extremeNumbers are numbers at and past every limit.
func extremeNumbers() []named {
	return []named{
		{"int64-min", mpI64(math.MinInt64)},
		{"int64-max", mpI64(math.MaxInt64)},
		{"uint64-max", mpUint64v(math.MaxUint64)},
		{"uint32-max", be32(mpUint32, math.MaxUint32)},
		{"minus-1", []byte{0xff}},
		{"int8-min", []byte{mpInt8, 0x80}},
		{"nan", mpF64(math.NaN())},
		{"plus-inf", mpF64(math.Inf(1))},
		{"minus-inf", mpF64(math.Inf(-1))},
		{"1e308", mpF64(1e308)},
		{"minus-1e308", mpF64(-1e308)},
		{"denormal", mpF64(5e-324)},
		{"minus-zero", mpF64(math.Copysign(0, -1))},
		{"2pow53-plus-1", mpF64(9007199254740993)},
		{"float32-nan", mpF32(float32(math.NaN()))},
		{"float32-inf", mpF32(float32(math.Inf(1)))},
	}
}

var jsonExtremeNumbers = []named{
	{"int64-min", []byte("-9223372036854775808")},
	{"int64-max", []byte("9223372036854775807")},
	{"int64-max-plus-1", []byte("9223372036854775808")},
	{"uint64-max", []byte("18446744073709551615")},
	{"uint64-max-plus-1", []byte("18446744073709551616")},
	{"minus-1", []byte("-1")},
	{"1e308", []byte("1e308")},
	{"1e309", []byte("1e309")},
	{"minus-1e309", []byte("-1e309")},
	{"nan-literal", []byte("NaN")},
	{"infinity-literal", []byte("Infinity")},
	{"1e-400", []byte("1e-400")},
	{"30-digits", []byte("123456789012345678901234567890")},
	{"minus-zero", []byte("-0")},
	{"float-for-int", []byte("1.5e3")},
	{"hex", []byte("0x10")},
	{"leading-zero", []byte("01")},
}

// badTokens are identities that cannot stand as one NATS subject token.
func badTokens() []named {
	return []named{
		{"dot", []byte("a.b")},
		{"only-dot", []byte(".")},
		{"star", []byte("*")},
		{"gt", []byte(">")},
		{"dot-gt", []byte("a.>")},
		{"space", []byte("a b")},
		{"tab", []byte("a\tb")},
		{"newline", []byte("a\r\nb")},
		{"ctrl-01", []byte("a\x01b")},
		{"del-7f", []byte("a\x7fb")},
		{"nel-u0085", []byte("a\u0085b")},
		{"nbsp", []byte("a\u00a0b")},
		{"u2028", []byte("a\u2028b")},
		{"empty", []byte("")},
		{"inbox", []byte("_INBOX.x")},
		{"srv", []byte("$SRV.PING")},
		{"10kb", bytes.Repeat([]byte("w"), 10<<10)},
		{"10kb-dots", bytes.Repeat([]byte("a."), 5<<10)},
	}
}

// builtinPaths are hostile paths for path fields.
var builtinPaths = []string{
	"relative.png",
	"./relative.png",
	"../../../../etc/passwd",
	"/etc/passwd",
	"/etc/shadow",
	"/tmp/../etc/passwd",
	"/proc/self/environ",
	"/proc/self/mem",
	"/dev/zero",
	"/dev/urandom",
	"/",
	"//",
	"/nul\x00.png",
	"/tmp/x.png\x00.txt",
	"/" + strings.Repeat("a/", 3000) + "x.png",
	"/" + strings.Repeat("b", 300) + ".png",
	"~/x.png",
	"file:///etc/passwd",
	"\\\\server\\share\\x.png",
}

// fieldSlot is one value of the message that can be replaced.
type fieldSlot struct {
	path string
	leaf string
	kind string
	set  func(v []byte) []byte
	dup  func(first, second []byte) []byte // nil for array elements
	del  func() []byte                     // nil for array elements
	key  func(k []byte) []byte             // nil for array elements
}

func mpFieldSlots(msg []byte, maxDepth int) []fieldSlot {
	var out []fieldSlot
	var walk func(b []byte, prefix, leaf string, wrap func([]byte) []byte, depth int)
	walk = func(b []byte, prefix, leaf string, wrap func([]byte) []byte, depth int) {
		if depth >= maxDepth {
			return
		}
		if entries, ok, err := splitMap(b); ok && err == nil {
			enc := func(es []entry) []byte { return wrap(encodeEntries(es)) }
			for i, en := range entries {
				path := en.name
				if prefix != "" {
					path = prefix + "." + en.name
				}
				s := fieldSlot{path: path, leaf: en.name, kind: kindOf(en.val).String()}
				s.set = func(v []byte) []byte {
					es := slices.Clone(entries)
					es[i].val = v
					return enc(es)
				}
				s.dup = func(a, c []byte) []byte {
					es := slices.Clone(entries)
					es[i].val = a
					es = slices.Insert(es, i+1, entry{name: en.name, key: en.key, val: c})
					return enc(es)
				}
				s.del = func() []byte { return enc(slices.Delete(slices.Clone(entries), i, i+1)) }
				s.key = func(k []byte) []byte {
					es := slices.Clone(entries)
					es[i].key = k
					return enc(es)
				}
				out = append(out, s)
				walk(en.val, path, en.name, s.set, depth+1)
			}
			return
		}
		if elems, ok, err := splitArray(b); ok && err == nil && len(elems) > 0 {
			path := prefix + "[0]"
			set := func(v []byte) []byte {
				es := slices.Clone(elems)
				es[0] = v
				return wrap(join(append([][]byte{arrayHeader(len(es))}, es...)...))
			}
			out = append(out, fieldSlot{path: path, leaf: leaf, kind: kindOf(elems[0]).String(), set: set})
			walk(elems[0], path, leaf, set, depth+1)
		}
	}
	walk(msg, "", "", func(b []byte) []byte { return b }, -1)
	return out
}

func jsonFieldSlots(msg []byte, maxDepth int) []fieldSlot {
	var out []fieldSlot
	var walk func(b []byte, prefix, leaf string, wrap func([]byte) []byte, depth int)
	walk = func(b []byte, prefix, leaf string, wrap func([]byte) []byte, depth int) {
		if depth >= maxDepth {
			return
		}
		if entries, ok, err := splitObject(b); ok && err == nil {
			for i, en := range entries {
				path := en.name
				if prefix != "" {
					path = prefix + "." + en.name
				}
				s := fieldSlot{path: path, leaf: en.name, kind: jsonKind(en.val)}
				s.set = func(v []byte) []byte {
					es := slices.Clone(entries)
					es[i].val = v
					return wrap(joinObject(es, nil))
				}
				s.dup = func(a, c []byte) []byte {
					es := slices.Clone(entries)
					es[i].val = a
					es = slices.Insert(es, i+1, jentry{name: en.name, val: c})
					return wrap(joinObject(es, nil))
				}
				s.del = func() []byte { return wrap(joinObject(slices.Delete(slices.Clone(entries), i, i+1), nil)) }
				s.key = func(k []byte) []byte {
					raw := make([]string, len(entries))
					raw[i] = string(k)
					return wrap(joinObject(entries, raw))
				}
				out = append(out, s)
				walk(en.val, path, en.name, s.set, depth+1)
			}
			return
		}
		if elems, ok, err := splitJSONArray(b); ok && err == nil && len(elems) > 0 {
			path := prefix + "[0]"
			set := func(v []byte) []byte {
				es := slices.Clone(elems)
				es[0] = v
				return wrap(joinArray(es))
			}
			out = append(out, fieldSlot{path: path, leaf: leaf, kind: jsonKind(elems[0]), set: set})
			walk(elems[0], path, leaf, set, depth+1)
		}
	}
	walk(msg, "", "", func(b []byte) []byte { return b }, -1)
	return out
}

func (g *Generator) isID(leaf string) bool {
	return slices.Contains(g.o.IDFields, strings.ToLower(leaf))
}

func isPath(leaf string) bool {
	l := strings.ToLower(leaf)
	return l == "path" || strings.HasSuffix(l, "_path") || l == "library" || l == "dir" || l == "items"
}

// fields emits every per-field mutation, msgpack first, then JSON.
func (g *Generator) fields(e *emitter) {
	headers := lyingHeaders()
	deep := deepArray(g.o.Depth)
	for _, s := range mpFieldSlots(g.mp, g.o.FieldDepth) {
		for _, h := range headers {
			if !e.emit(CatLength, h.name, s.path, s.set(h.b), false) {
				return
			}
		}
		if s.kind == "str" || g.isID(s.leaf) || isPath(s.leaf) {
			for _, u := range invalidUTF8 {
				e.emit(CatUTF8, u.name, s.path, s.set(mpStr(string(u.b))), false)
			}
			// The same bytes inside a str8 header, as a client library might write them.
			e.emit(CatUTF8, "ff-str8", s.path, s.set([]byte{mpStr8, 1, 0xff}), false)
		}
		if s.key != nil {
			e.emit(CatUTF8, "key-ff", s.path, s.key(mpStr(s.leaf+"\xff")), false)
			e.emit(CatUTF8, "key-nul", s.path, s.key(mpStr(s.leaf+"\x00")), false)
		}
		for _, w := range wrongTypes() {
			if s.kind == kindOf(w.b).String() && s.kind != "ext" {
				continue
			}
			e.emit(CatType, w.name, s.path, s.set(w.b), false)
		}
		for _, n := range extremeNumbers() {
			e.emit(CatNumber, n.name, s.path, s.set(n.b), false)
		}
		g.emitTokens(e, s.path, s.leaf, func(v string) []byte { return s.set(mpStr(v)) }, false)
		e.emitLazy(CatNesting, fmt.Sprintf("array-%d", g.o.Depth), s.path, func() []byte { return s.set(deep) }, false)
		if s.dup != nil {
			orig := originalOf(g.mp, s.path)
			e.emit(CatDupKey, "valid-then-ff", s.path, s.dup(orig, mpStr("\xff")), false)
			e.emit(CatDupKey, "map-then-valid", s.path, s.dup([]byte{0x81, 0xa1, 'a', 0x01}, orig), false)
			e.emit(CatDupKey, "valid-then-array32-max", s.path, s.dup(orig, []byte{mpArray32, 0xff, 0xff, 0xff, 0xff}), false)
			e.emit(CatMissing, "field", s.path, s.del(), false)
		}
	}
	if e.stopped {
		return
	}
	jdeep := deepJSONArray(g.o.Depth)
	for _, s := range jsonFieldSlots(g.js, g.o.FieldDepth) {
		if s.kind == "string" || g.isID(s.leaf) || isPath(s.leaf) {
			for _, u := range jsonBadStrings {
				if !e.emit(CatUTF8, u.name, s.path, s.set(u.b), true) {
					return
				}
			}
		}
		if s.key != nil {
			e.emit(CatUTF8, "key-lone-udfff", s.path, s.key([]byte(`"`+s.leaf+`\udfff"`)), true)
			e.emit(CatUTF8, "key-raw-ff", s.path, s.key([]byte("\""+s.leaf+"\xff\"")), true)
		}
		for _, w := range jsonWrongTypes {
			if s.kind == jsonKind(w.b) {
				continue
			}
			e.emit(CatType, w.name, s.path, s.set(w.b), true)
		}
		for _, n := range jsonExtremeNumbers {
			e.emit(CatNumber, n.name, s.path, s.set(n.b), true)
		}
		g.emitTokens(e, s.path, s.leaf, func(v string) []byte { return s.set(jsonStr(v)) }, true)
		e.emitLazy(CatNesting, fmt.Sprintf("array-%d", g.o.Depth), s.path, func() []byte { return s.set(jdeep) }, true)
		if s.dup != nil {
			orig := jsonFieldValue(s, g.js)
			e.emit(CatDupKey, "valid-then-udfff", s.path, s.dup(orig, []byte(`"\udfff"`)), true)
			e.emit(CatDupKey, "object-then-valid", s.path, s.dup([]byte(`{"a":1}`), orig), true)
			e.emit(CatMissing, "field", s.path, s.del(), true)
		}
	}
}

// originalOf returns the raw value at a dotted path of msg (maps only, [0] for arrays).
func originalOf(msg []byte, path string) []byte {
	cur := msg
	for _, part := range splitPath(path) {
		if part == "[0]" {
			elems, ok, err := splitArray(cur)
			if !ok || err != nil || len(elems) == 0 {
				return []byte{mpNil}
			}
			cur = elems[0]
			continue
		}
		entries, ok, err := splitMap(cur)
		if !ok || err != nil {
			return []byte{mpNil}
		}
		found := false
		for _, en := range entries {
			if en.name == part {
				cur, found = en.val, true
				break
			}
		}
		if !found {
			return []byte{mpNil}
		}
	}
	return cur
}

func jsonFieldValue(s fieldSlot, msg []byte) []byte {
	cur := json.RawMessage(msg)
	for _, part := range splitPath(s.path) {
		if part == "[0]" {
			elems, ok, err := splitJSONArray(cur)
			if !ok || err != nil || len(elems) == 0 {
				return []byte("null")
			}
			cur = elems[0]
			continue
		}
		entries, ok, err := splitObject(cur)
		if !ok || err != nil {
			return []byte("null")
		}
		found := false
		for _, en := range entries {
			if en.name == part {
				cur, found = en.val, true
				break
			}
		}
		if !found {
			return []byte("null")
		}
	}
	return cur
}

// splitPath splits "a.b[0].c" into a, b, [0], c.
func splitPath(p string) []string {
	var out []string
	for _, part := range strings.Split(p, ".") {
		for strings.HasSuffix(part, "[0]") {
			base := strings.TrimSuffix(part, "[0]")
			if base != "" {
				out = append(out, base)
			}
			out = append(out, "[0]")
			part = ""
		}
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

// tokenName is a short printable name for a value in a mutation name.
func tokenName(s string) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= 24 {
			b.WriteString("~")
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if n := len(s); n > 24 {
		fmt.Fprintf(&b, "%db", n)
	}
	return b.String()
}

// ---- huge bodies ----

// huge emits valid-looking bodies of up to MaxBody bytes. Each is built only when kept
// (emitLazy), in one allocation (longVal): under the race detector the tests run with,
// every copy of a megabyte costs.
func (g *Generator) huge(e *emitter) {
	entries, _, _ := splitMap(g.mp)
	jentries, _, _ := splitObject(g.js)
	var sizes []int
	for _, s := range []int{64 << 10, g.o.MaxBody / 2, g.o.MaxBody} {
		if s > 0 && !slices.Contains(sizes, s) && s <= g.o.MaxBody {
			sizes = append(sizes, s)
		}
	}
	padded := append(slices.Clone(entries), entry{name: "pad", key: mpStr("pad")})
	jpadded := append(slices.Clone(jentries), jentry{name: "pad"})
	pad, jpad := len(padded)-1, len(jpadded)-1
	for _, size := range sizes {
		room := size - len(g.mp) - 32
		if room <= 0 {
			continue
		}
		// An unknown field holding a long valid string.
		if !e.emitLazy(CatHuge, fmt.Sprintf("pad-string-%d", size), "", func() []byte {
			return encodeEntriesLong(padded, pad, mpStrLong('p', room))
		}, false) {
			return
		}
		// An unknown field holding an array of small ints.
		e.emitLazy(CatHuge, fmt.Sprintf("int-array-%d", size), "", func() []byte {
			return encodeEntriesLong(padded, pad, longVal{head: arrayHeader(room), fill: []byte{0x01}, n: room})
		}, false)
		// Many unknown keys: fixstr "k" + 7 digits, and a fixint value (10 bytes each).
		e.emitLazy(CatHuge, fmt.Sprintf("many-keys-%d", size), "", func() []byte { return manyKeys(entries, len(g.mp), room/10) }, false)
		// Every string field of the message made long (at the largest size).
		for i, en := range entries {
			if kindOf(en.val) == kStr && size == g.o.MaxBody {
				e.emitLazy(CatHuge, fmt.Sprintf("long-%s-%d", en.name, size), "", func() []byte {
					return encodeEntriesLong(entries, i, mpStrLong('s', room))
				}, false)
			}
		}
		// JSON.
		jroom := size - len(g.js) - 32
		if jroom <= 0 {
			continue
		}
		e.emitLazy(CatHuge, fmt.Sprintf("pad-string-%d", size), "", func() []byte {
			return joinObjectLong(jpadded, nil, jpad, jsonStrLong('p', jroom))
		}, true)
		e.emitLazy(CatHuge, fmt.Sprintf("int-array-%d", size), "", func() []byte {
			nums := longVal{head: []byte("["), fill: []byte("1,"), n: max(0, jroom/2-2), tail: []byte("1]")}
			return joinObjectLong(jpadded, nil, jpad, nums)
		}, true)
		for i, en := range jentries {
			if jsonKind(en.val) == "string" && size == g.o.MaxBody {
				e.emitLazy(CatHuge, fmt.Sprintf("long-%s-%d", en.name, size), "", func() []byte {
					return joinObjectLong(jentries, nil, i, jsonStrLong('s', jroom))
				}, true)
			}
		}
	}
}

// manyKeys writes the map of entries followed by n more: fixstr "k" + 7 digits, and a
// fixint value (10 bytes each). size is the bytes of the entries.
func manyKeys(entries []entry, size, n int) []byte {
	many := make([]byte, 0, 5+size+10*n)
	many = append(many, be32(mpMap32, uint32(len(entries)+n))...)
	for _, en := range entries {
		many = append(many, en.key...)
		many = append(many, en.val...)
	}
	for i := 0; i < n; i++ {
		var digits [8]byte
		strconv.AppendInt(digits[:0], int64(10000000+i), 10) // "1" and 7 digits of i
		many = append(many, 0xa8, 'k')
		many = append(many, digits[1:]...)
		many = append(many, 0x01)
	}
	return many
}

// longVal is a value written straight into a huge body: head, n copies of fill, tail.
type longVal struct {
	head, fill, tail []byte
	n                int
}

// mpStrLong is mpStr of n copies of c.
func mpStrLong(c byte, n int) longVal { return longVal{head: strHeader(n), fill: []byte{c}, n: n} }

// jsonStrLong is jsonStr of n copies of c, a character JSON does not escape.
func jsonStrLong(c byte, n int) longVal {
	return longVal{head: []byte(`"`), fill: []byte{c}, n: n, tail: []byte(`"`)}
}

func (v longVal) size() int { return len(v.head) + v.n*len(v.fill) + len(v.tail) }

// appendTo appends v to b, which has room for it: the fill is doubled in place.
func (v longVal) appendTo(b []byte) []byte {
	b = append(b, v.head...)
	if v.n > 0 {
		start, total := len(b), v.n*len(v.fill)
		b = append(b, v.fill...)
		for done := len(b) - start; done < total; done = len(b) - start {
			b = append(b, b[start:start+min(done, total-done)]...)
		}
	}
	return append(b, v.tail...)
}

// encodeEntries writes entries as a msgpack map with the smallest header.
func encodeEntries(es []entry) []byte { return encodeEntriesLong(es, -1, longVal{}) }

// encodeEntriesLong is encodeEntries with the value of entry i (when 0 <= i) replaced
// by v, in one allocation.
func encodeEntriesLong(es []entry, i int, v longVal) []byte {
	h := mapHeader(len(es))
	size := len(h)
	for k, x := range es {
		size += len(x.key) + len(x.val)
		if k == i {
			size += v.size() - len(x.val)
		}
	}
	b := append(make([]byte, 0, size), h...)
	for k, x := range es {
		b = append(b, x.key...)
		if k == i {
			b = v.appendTo(b)
		} else {
			b = append(b, x.val...)
		}
	}
	return b
}

// ---- unknown fields ----

func (g *Generator) unknown(e *emitter) {
	entries, _, _ := splitMap(g.mp)
	add := func(name string, k, v []byte) bool {
		es := append(slices.Clone(entries), entry{key: k, val: v})
		return e.emit(CatUnknown, name, "", encodeEntries(es), false)
	}
	for _, u := range []struct {
		name string
		k, v []byte
	}{
		{"zzz", mpStr("zzz"), []byte{0x01}},
		{"proto", mpStr("__proto__"), []byte{0x81, 0xa5, 'a', 'd', 'm', 'i', 'n', mpTrue}},
		{"constructor", mpStr("constructor"), mpStr("x")},
		{"empty-key", mpStr(""), []byte{0x01}},
		{"key-10kb", mpStr(strings.Repeat("k", 10<<10)), []byte{0x01}},
		{"key-ff", mpStr("\xff"), []byte{0x01}},
		{"int-key", []byte{0x01}, []byte{0x01}},
		{"nil-key", []byte{mpNil}, []byte{0x01}},
		{"array-key", []byte{0x91, 0x01}, []byte{0x01}},
		{"map-key", []byte{0x81, 0xa1, 'a', 0x01}, []byte{0x01}},
		{"bin-key", mpBin([]byte("id")), mpStr("x")},
		{"float-key", mpF64(1.5), []byte{0x01}},
		{"ext-key", []byte{mpFixExt1, 0x01, 0x00}, []byte{0x01}},
		{"upper-ID", mpStr("ID"), mpStr("upper")},
		{"v-99", mpStr("v"), []byte{99}},
	} {
		if !add(u.name, u.k, u.v) {
			return
		}
	}
	jentries, _, _ := splitObject(g.js)
	jadd := func(name, rawKey string, v []byte) bool {
		es := append(slices.Clone(jentries), jentry{val: v})
		raw := make([]string, len(es))
		raw[len(es)-1] = rawKey
		return e.emit(CatUnknown, name, "", joinObject(es, raw), true)
	}
	for _, u := range []struct{ name, k, v string }{
		{"zzz", `"zzz"`, "1"},
		{"proto", `"__proto__"`, `{"admin":true}`},
		{"constructor", `"constructor"`, `{"prototype":{"x":1}}`},
		{"empty-key", `""`, "1"},
		{"key-lone-udfff", `"\udfff"`, "1"},
		{"key-10kb", `"` + strings.Repeat("k", 10<<10) + `"`, "1"},
		{"upper-ID", `"ID"`, `"upper"`},
		{"v-99", `"v"`, "99"},
	} {
		if !jadd(u.name, u.k, []byte(u.v)) {
			return
		}
	}
	// Not JSON at all, though close.
	for _, m := range []named{
		{"single-quotes", []byte(`{'id':'x'}`)},
		{"trailing-comma", []byte(`{"id":"x",}`)},
		{"unquoted-key", []byte(`{id:"x"}`)},
		{"comment", []byte(`{"id":"x" /* c */}`)},
		{"unterminated-string", []byte(`{"id":"x`)},
	} {
		if !e.emit(CatUnknown, m.name, "", m.b, true) {
			return
		}
	}
}

// ---- random damage ----

var interesting = []byte{0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc4, 0xc6, 0xc7, 0xc9, 0xd4, 0xd8, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xff}

func (g *Generator) random(e *emitter) {
	rng := rand.New(rand.NewPCG(g.o.Seed, 0x72616e646f6d))
	for i := 0; i < g.o.Random; i++ {
		asJSON := i%4 == 3
		src := g.mp
		if asJSON {
			src = g.js
		}
		b := slices.Clone(src)
		ops := 1 + rng.IntN(4)
		var what []string
		for k := 0; k < ops && len(b) > 0; k++ {
			at := rng.IntN(len(b))
			switch rng.IntN(6) {
			case 0:
				b[at] ^= byte(1 << rng.IntN(8))
				what = append(what, "flip")
			case 1:
				b[at] = interesting[rng.IntN(len(interesting))]
				what = append(what, "set")
			case 2:
				hdr := []byte{mpArray32, 0xff, 0xff, 0xff, 0xff}
				if asJSON {
					hdr = []byte(`"\udfff`)
				}
				b = slices.Insert(b, at, hdr...)
				what = append(what, "insert")
			case 3:
				end := min(len(b), at+1+rng.IntN(8))
				b = slices.Delete(b, at, end)
				what = append(what, "delete")
			case 4:
				end := min(len(b), at+1+rng.IntN(16))
				b = slices.Insert(b, at, slices.Clone(b[at:end])...)
				what = append(what, "repeat")
			case 5:
				var x [8]byte
				binary.LittleEndian.PutUint64(x[:], rng.Uint64())
				b = slices.Insert(b, at, x[:1+rng.IntN(8)]...)
				what = append(what, "noise")
			}
		}
		if !e.emit(CatRandom, fmt.Sprintf("%d-%s", i, strings.Join(what, "-")), "", b, asJSON) {
			return
		}
	}
}

// ---- conversions ----

func msgpackToJSON(b []byte) ([]byte, error) {
	var v any
	if err := msgpack.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return json.Marshal(jsonable(v))
}

// jsonable turns msgpack's generic values (maps with any keys) into ones encoding/json takes.
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case map[any]any:
		out := map[string]any{}
		for k, e := range x {
			out[fmt.Sprint(k)] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
	case float32:
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil
		}
	}
	return v
}

func jsonToMsgpack(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return codec.Marshal(numbers(v))
}

// numbers turns json.Number into int64 or float64.
func numbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = numbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbers(e)
		}
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	}
	return v
}

func validUTF8(s string) bool { return utf8.ValidString(s) }

// emitTokens emits, for a field whose name says it holds an identity or a path, the
// field set to each bad token and each forged identity, or to each hostile path; set
// encodes a string value into the whole body (msgpack, or JSON with asJSON).
func (g *Generator) emitTokens(e *emitter, field, leaf string, set func(string) []byte, asJSON bool) {
	if g.isID(leaf) {
		for _, t := range badTokens() {
			e.emit(CatIdentity, t.name, field, set(string(t.b)), asJSON)
		}
		for i, f := range g.o.Forge[strings.ToLower(leaf)] {
			e.emit(CatForged, fmt.Sprintf("%d-%s", i, tokenName(f)), field, set(f), asJSON)
		}
	}
	if isPath(leaf) {
		for i, p := range append(slices.Clone(builtinPaths), g.o.Paths...) {
			e.emit(CatPath, fmt.Sprintf("%d-%s", i, tokenName(p)), field, set(p), asJSON)
		}
	}
}
