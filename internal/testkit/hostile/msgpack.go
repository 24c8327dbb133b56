package hostile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Raw msgpack, written by hand: a library encoder never writes a length header that lies,
// and the generator needs exactly that. The scanner (skip, splitMap) reads only the VALID
// sample, so it may be strict.

// msgpack type bytes.
const (
	mpNil      = 0xc0
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpBin16    = 0xc5
	mpBin32    = 0xc6
	mpExt8     = 0xc7
	mpExt16    = 0xc8
	mpExt32    = 0xc9
	mpFloat32  = 0xca
	mpFloat64  = 0xcb
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixExt1  = 0xd4
	mpFixExt2  = 0xd5
	mpFixExt4  = 0xd6
	mpFixExt8  = 0xd7
	mpFixExt16 = 0xd8
	mpStr8     = 0xd9
	mpStr16    = 0xda
	mpStr32    = 0xdb
	mpArray16  = 0xdc
	mpArray32  = 0xdd
	mpMap16    = 0xde
	mpMap32    = 0xdf
)

// kind is the broad type of one msgpack value.
type kind int

const (
	kNil kind = iota
	kBool
	kInt
	kFloat
	kStr
	kBin
	kArray
	kMap
	kExt
)

func (k kind) String() string {
	return [...]string{"nil", "bool", "int", "float", "str", "bin", "array", "map", "ext"}[k]
}

var errShort = errors.New("msgpack: truncated")

// head reads the header of the value at b[i]: its kind, the length of the header, the
// number of payload bytes that follow it (str, bin, ext, scalars) and the number of
// child values (arrays: n, maps: 2n).
func head(b []byte, i int) (k kind, hdr, payload, children int, err error) {
	if i >= len(b) {
		return 0, 0, 0, 0, errShort
	}
	c := b[i]
	u := func(n int) (int, error) {
		if i+1+n > len(b) {
			return 0, errShort
		}
		switch n {
		case 1:
			return int(b[i+1]), nil
		case 2:
			return int(binary.BigEndian.Uint16(b[i+1:])), nil
		default:
			return int(binary.BigEndian.Uint32(b[i+1:])), nil
		}
	}
	switch {
	case c <= 0x7f || c >= 0xe0:
		return kInt, 1, 0, 0, nil
	case c <= 0x8f:
		return kMap, 1, 0, 2 * int(c&0x0f), nil
	case c <= 0x9f:
		return kArray, 1, 0, int(c & 0x0f), nil
	case c <= 0xbf:
		return kStr, 1, int(c & 0x1f), 0, nil
	}
	var n int
	switch c {
	case mpNil:
		return kNil, 1, 0, 0, nil
	case mpFalse, mpTrue:
		return kBool, 1, 0, 0, nil
	case mpBin8, mpBin16, mpBin32, mpStr8, mpStr16, mpStr32:
		w := map[byte]int{mpBin8: 1, mpBin16: 2, mpBin32: 4, mpStr8: 1, mpStr16: 2, mpStr32: 4}[c]
		if n, err = u(w); err != nil {
			return
		}
		k = kBin
		if c >= mpStr8 {
			k = kStr
		}
		return k, 1 + w, n, 0, nil
	case mpExt8, mpExt16, mpExt32:
		w := map[byte]int{mpExt8: 1, mpExt16: 2, mpExt32: 4}[c]
		if n, err = u(w); err != nil {
			return
		}
		return kExt, 2 + w, n, 0, nil
	case mpFloat32:
		return kFloat, 1, 4, 0, nil
	case mpFloat64:
		return kFloat, 1, 8, 0, nil
	case mpUint8, mpInt8:
		return kInt, 1, 1, 0, nil
	case mpUint16, mpInt16:
		return kInt, 1, 2, 0, nil
	case mpUint32, mpInt32:
		return kInt, 1, 4, 0, nil
	case mpUint64, mpInt64:
		return kInt, 1, 8, 0, nil
	case mpFixExt1, mpFixExt2, mpFixExt4, mpFixExt8, mpFixExt16:
		return kExt, 2, 1 << (c - mpFixExt1), 0, nil
	case mpArray16, mpArray32:
		w := 2
		if c == mpArray32 {
			w = 4
		}
		if n, err = u(w); err != nil {
			return
		}
		return kArray, 1 + w, 0, n, nil
	case mpMap16, mpMap32:
		w := 2
		if c == mpMap32 {
			w = 4
		}
		if n, err = u(w); err != nil {
			return
		}
		return kMap, 1 + w, 0, 2 * n, nil
	}
	return 0, 0, 0, 0, fmt.Errorf("msgpack: byte 0x%02x at %d is not a type", c, i)
}

// skip returns the offset just past the value at b[i], for values nested at most 64 deep.
func skip(b []byte, i int) (int, error) {
	return skipDepth(b, i, 0)
}

func skipDepth(b []byte, i, depth int) (int, error) {
	if depth > 64 {
		return 0, errors.New("msgpack: nested too deep for a sample")
	}
	_, hdr, payload, children, err := head(b, i)
	if err != nil {
		return 0, err
	}
	j := i + hdr + payload
	if j > len(b) {
		return 0, errShort
	}
	for c := 0; c < children; c++ {
		if j, err = skipDepth(b, j, depth+1); err != nil {
			return 0, err
		}
	}
	return j, nil
}

// entry is one key/value pair of a msgpack map, as raw bytes.
type entry struct {
	name string // the key as text (for naming); "#i" for a key that is not a string
	key  []byte
	val  []byte
}

// splitMap splits the map at the start of b into its entries; ok is false when b does not
// start with a map.
func splitMap(b []byte) (entries []entry, ok bool, err error) {
	k, hdr, _, children, err := head(b, 0)
	if err != nil || k != kMap {
		return nil, false, err
	}
	j := hdr
	for c := 0; c < children/2; c++ {
		ke, err := skip(b, j)
		if err != nil {
			return nil, true, err
		}
		ve, err := skip(b, ke)
		if err != nil {
			return nil, true, err
		}
		e := entry{key: b[j:ke], val: b[ke:ve], name: fmt.Sprintf("#%d", c)}
		if s, ok := strOf(b[j:ke]); ok {
			e.name = s
		}
		entries = append(entries, e)
		j = ve
	}
	return entries, true, nil
}

// splitArray splits the array at the start of b into its elements.
func splitArray(b []byte) (elems [][]byte, ok bool, err error) {
	k, hdr, _, children, err := head(b, 0)
	if err != nil || k != kArray {
		return nil, false, err
	}
	j := hdr
	for c := 0; c < children; c++ {
		e, err := skip(b, j)
		if err != nil {
			return nil, true, err
		}
		elems = append(elems, b[j:e])
		j = e
	}
	return elems, true, nil
}

// strOf returns the text of a msgpack str value.
func strOf(b []byte) (string, bool) {
	k, hdr, payload, _, err := head(b, 0)
	if err != nil || k != kStr || hdr+payload > len(b) {
		return "", false
	}
	return string(b[hdr : hdr+payload]), true
}

func kindOf(b []byte) kind {
	k, _, _, _, err := head(b, 0)
	if err != nil {
		return kNil
	}
	return k
}

// mapHeader writes the smallest map header for n entries.
func mapHeader(n int) []byte {
	switch {
	case n < 16:
		return []byte{0x80 | byte(n)}
	case n < 1<<16:
		return []byte{mpMap16, byte(n >> 8), byte(n)}
	default:
		return be32(mpMap32, uint32(n))
	}
}

// arrayHeader writes the smallest array header for n elements.
func arrayHeader(n int) []byte {
	switch {
	case n < 16:
		return []byte{0x90 | byte(n)}
	case n < 1<<16:
		return []byte{mpArray16, byte(n >> 8), byte(n)}
	default:
		return be32(mpArray32, uint32(n))
	}
}

// mpStr writes s as a msgpack str with the smallest header, whatever its bytes.
func mpStr(s string) []byte {
	return append(strHeader(len(s)), s...)
}

// strHeader writes the smallest msgpack str header for n bytes.
func strHeader(n int) []byte {
	switch {
	case n < 32:
		return []byte{0xa0 | byte(n)}
	case n < 1<<8:
		return []byte{mpStr8, byte(n)}
	case n < 1<<16:
		return []byte{mpStr16, byte(n >> 8), byte(n)}
	default:
		return be32(mpStr32, uint32(n))
	}
}

// mpBin writes b as msgpack bin with the smallest header.
func mpBin(b []byte) []byte {
	n := len(b)
	var h []byte
	switch {
	case n < 1<<8:
		h = []byte{mpBin8, byte(n)}
	case n < 1<<16:
		h = []byte{mpBin16, byte(n >> 8), byte(n)}
	default:
		h = be32(mpBin32, uint32(n))
	}
	return append(h, b...)
}

func be32(c byte, n uint32) []byte {
	return []byte{c, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
}

func be64(c byte, n uint64) []byte {
	b := make([]byte, 9)
	b[0] = c
	binary.BigEndian.PutUint64(b[1:], n)
	return b
}

func mpI64(v int64) []byte      { return be64(mpInt64, uint64(v)) }
func mpUint64v(v uint64) []byte { return be64(mpUint64, v) }
func mpF64(f float64) []byte    { return be64(mpFloat64, math.Float64bits(f)) }
func mpF32(f float32) []byte {
	return be32(mpFloat32, math.Float32bits(f))
}

// join concatenates byte slices into a new one.
func join(parts ...[]byte) []byte {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// lengthHeader is one msgpack header family whose length can lie.
type lengthHeader struct {
	name  string
	code  byte
	width int  // bytes of the length field (0 for fix formats)
	ext   bool // an ext type byte follows the length
	fix   int  // fix formats: the largest value of the low bits
}

var lengthHeaders = []lengthHeader{
	{name: "fixstr", code: 0xa0, fix: 31},
	{name: "fixarray", code: 0x90, fix: 15},
	{name: "fixmap", code: 0x80, fix: 15},
	{name: "str8", code: mpStr8, width: 1},
	{name: "str16", code: mpStr16, width: 2},
	{name: "str32", code: mpStr32, width: 4},
	{name: "bin8", code: mpBin8, width: 1},
	{name: "bin16", code: mpBin16, width: 2},
	{name: "bin32", code: mpBin32, width: 4},
	{name: "array16", code: mpArray16, width: 2},
	{name: "array32", code: mpArray32, width: 4},
	{name: "map16", code: mpMap16, width: 2},
	{name: "map32", code: mpMap32, width: 4},
	{name: "ext8", code: mpExt8, width: 1, ext: true},
	{name: "ext16", code: mpExt16, width: 2, ext: true},
	{name: "ext32", code: mpExt32, width: 4, ext: true},
}

// lyingHeaders returns the header variants of every family: the maximum length, one less,
// half, and a small lie (16), each with a name. The bytes that follow in the message are
// whatever comes after the header where it is placed.
func lyingHeaders() []named {
	var out []named
	for _, h := range lengthHeaders {
		if h.fix > 0 {
			out = append(out,
				named{h.name + "/max", []byte{h.code | byte(h.fix)}},
				named{h.name + "/max-1", []byte{h.code | byte(h.fix-1)}})
			continue
		}
		max := uint64(1)<<(8*h.width) - 1
		for _, v := range []struct {
			tag string
			n   uint64
		}{{"max", max}, {"max-1", max - 1}, {"half", max / 2}, {"16", 16}} {
			b := []byte{h.code}
			for i := h.width - 1; i >= 0; i-- {
				b = append(b, byte(v.n>>(8*i)))
			}
			if h.ext {
				b = append(b, 0x01) // an application ext type
			}
			out = append(out, named{h.name + "/" + v.tag, b})
		}
	}
	// fixext: a type byte and a payload of 1..16 bytes, here with none of it present.
	for i, c := range []byte{mpFixExt1, mpFixExt2, mpFixExt4, mpFixExt8, mpFixExt16} {
		out = append(out, named{fmt.Sprintf("fixext%d/nopayload", 1<<i), []byte{c, 0x01}})
	}
	// Scalars whose payload is missing.
	for _, c := range []struct {
		name string
		b    byte
	}{{"float64", mpFloat64}, {"uint64", mpUint64}, {"int64", mpInt64}, {"float32", mpFloat32}, {"uint32", mpUint32}} {
		out = append(out, named{c.name + "/nopayload", []byte{c.b}})
	}
	out = append(out, named{"reserved-0xc1", []byte{0xc1}})
	return out
}

// named is a piece of raw bytes with a name.
type named struct {
	name string
	b    []byte
}
