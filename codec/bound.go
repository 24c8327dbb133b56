package codec

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// Every byte from the bus is hostile until checked. Before any message is decoded into a
// Go value it is walked once, without allocating, and refused with bad_request unless:
//
//  1. every length header (str, bin, ext, array, map) fits in the bytes that follow it:
//     an array or map cannot claim more elements than there are bytes left, so the
//     decoder never allocates more than the message's own size can justify (this also
//     covers the msgpack library's slice allocation limit, which v5.4.x never applies);
//  2. nesting is at most MaxDepth arrays/maps deep (JSON: objects/arrays);
//  3. every string is valid UTF-8 (msgpack str; a JSON body as a whole);
//  4. the message is exactly one value: no trailing bytes.
//
// The walk is the single door: Unmarshal and Decode both go through it, for every
// message type (requests, work items, replies, heartbeats, claims, cancels, journal).

// MaxDepth is the deepest nesting of arrays and maps (JSON objects and arrays) a message
// may have. The deepest legitimate message (a status reply: reply → workers → heartbeat →
// models → model) is 5 deep.
const MaxDepth = 16

// checkMsgpack walks one msgpack value filling data exactly (rules 1-4).
func checkMsgpack(data []byte) error {
	w := walker{b: data}
	if err := w.value(0); err != nil {
		return err
	}
	if w.i != len(w.b) {
		return fmt.Errorf("%d bytes after the message's value", len(w.b)-w.i)
	}
	return nil
}

type walker struct {
	b []byte
	i int
}

func (w *walker) left() int { return len(w.b) - w.i }

// n reads a big-endian unsigned length of size bytes (1, 2 or 4).
func (w *walker) n(size int) (int, error) {
	if w.left() < size {
		return 0, fmt.Errorf("truncated length at byte %d", w.i)
	}
	var v uint64
	switch size {
	case 1:
		v = uint64(w.b[w.i])
	case 2:
		v = uint64(binary.BigEndian.Uint16(w.b[w.i:]))
	case 4:
		v = uint64(binary.BigEndian.Uint32(w.b[w.i:]))
	}
	w.i += size
	if v > uint64(w.left()) {
		return 0, fmt.Errorf("length %d at byte %d is more than the %d bytes left", v, w.i-size, w.left())
	}
	return int(v), nil
}

// skip consumes size bytes.
func (w *walker) skip(size int) error {
	if w.left() < size {
		return fmt.Errorf("truncated value at byte %d", w.i)
	}
	w.i += size
	return nil
}

// str consumes a string of n bytes, which must be valid UTF-8.
func (w *walker) str(n int) error {
	s := w.b[w.i : w.i+n]
	if !utf8.Valid(s) {
		return fmt.Errorf("string at byte %d is not valid UTF-8", w.i)
	}
	w.i += n
	return nil
}

// items consumes count values (2*count for a map), each at depth+1.
func (w *walker) items(count, depth int) error {
	if depth+1 > MaxDepth {
		return fmt.Errorf("nested deeper than %d at byte %d", MaxDepth, w.i)
	}
	for k := 0; k < count; k++ {
		if err := w.value(depth + 1); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) value(depth int) error {
	if w.left() < 1 {
		return fmt.Errorf("truncated message at byte %d", w.i)
	}
	c := w.b[w.i]
	w.i++
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixint, nil, bool
		return nil
	case c >= 0xa0 && c <= 0xbf: // fixstr
		n := int(c & 0x1f)
		if n > w.left() {
			return fmt.Errorf("string length %d at byte %d is more than the %d bytes left", n, w.i-1, w.left())
		}
		return w.str(n)
	case c >= 0x90 && c <= 0x9f: // fixarray
		return w.items(int(c&0x0f), depth)
	case c >= 0x80 && c <= 0x8f: // fixmap
		return w.items(2*int(c&0x0f), depth)
	}
	switch c {
	case 0xcc, 0xd0: // uint8, int8
		return w.skip(1)
	case 0xcd, 0xd1: // uint16, int16
		return w.skip(2)
	case 0xce, 0xd2, 0xca: // uint32, int32, float32
		return w.skip(4)
	case 0xcf, 0xd3, 0xcb: // uint64, int64, float64
		return w.skip(8)
	case 0xd9, 0xda, 0xdb: // str8/16/32
		n, err := w.n(1 << (c - 0xd9))
		if err != nil {
			return err
		}
		return w.str(n)
	case 0xc4, 0xc5, 0xc6: // bin8/16/32
		n, err := w.n(1 << (c - 0xc4))
		if err != nil {
			return err
		}
		return w.skip(n)
	case 0xdc, 0xdd: // array16/32
		n, err := w.n(2 << (c - 0xdc))
		if err != nil {
			return err
		}
		return w.items(n, depth)
	case 0xde, 0xdf: // map16/32: 2 values an entry, so at most left/2 entries
		n, err := w.n(2 << (c - 0xde))
		if err != nil {
			return err
		}
		if 2*n > w.left() {
			return fmt.Errorf("map of %d entries at byte %d cannot fit in the %d bytes left", n, w.i, w.left())
		}
		return w.items(2*n, depth)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1/2/4/8/16: type byte + data
		return w.skip(1 + 1<<(c-0xd4))
	case 0xc7, 0xc8, 0xc9: // ext8/16/32: length, type byte, data
		n, err := w.n(1 << (c - 0xc7))
		if err != nil {
			return err
		}
		return w.skip(1 + n)
	}
	return fmt.Errorf("invalid msgpack code 0x%02x at byte %d", c, w.i-1)
}

// checkJSON enforces rules 2 and 3 on a JSON body: valid UTF-8 throughout, and brackets
// nested at most MaxDepth deep (strings skipped). encoding/json checks the rest, and
// allocates only as it reads values that are really there.
func checkJSON(data []byte) error {
	if !utf8.Valid(data) {
		return fmt.Errorf("body is not valid UTF-8")
	}
	depth, inStr := 0, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if inStr {
			switch c {
			case '\\':
				i++
			case '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '[', '{':
			if depth++; depth > MaxDepth {
				return fmt.Errorf("nested deeper than %d at byte %d", MaxDepth, i)
			}
		case ']', '}':
			depth--
		}
	}
	return nil
}
