// Package npy reads and writes NumPy's .npy files (format versions 1.0, 2.0 and 3.0) for
// the element types of codec.Tensor, in C order: little-endian float32 ('<f4'), float64
// ('<f8'), float16 ('<f2'), int64 ('<i8'), int32 ('<i4'), int16 ('<i2'), int8 ('|i1'),
// uint64 ('<u8'), uint32 ('<u4'), uint16 ('<u2'), uint8 ('|u1') and bool ('|b1'); string
// tensors as NumPy's fixed-width unicode ('<U{n}', UTF-32LE: see unicode.go).
//
// bfloat16 has no NumPy dtype of its own. ml_dtypes' bfloat16 (the dtype JAX, TensorFlow and
// Keras use with NumPy) has the type code 'V', so np.save writes it as '<V2' (a 2-byte void,
// read back with np.load(f).view(ml_dtypes.bfloat16)); Keras reads every 2-byte void as
// bfloat16, and so does Decode ('<V2', '|V2', and 'bfloat16', the descr a header written by
// hand from str(dtype) carries). Encode writes a bfloat16 tensor as '<V2'. A '<u2' file is
// uint16, which a bfloat16 model input refuses.
//
// Every byte of a file is hostile. Decode works on a file already read into memory (the
// caller bounds that read) and allocates only the shape it returns (at most MaxRank
// dimensions): the header length is bounded by MaxHeaderLen, the header is parsed by a small
// grammar of its own (no evaluation), the shape's element count is checked for overflow and
// against codec.MaxTensorElems, and the data must be exactly the size the header declares.
// It never panics; every refusal is an error naming what is wrong.
//
// (The Go module codeberg.org/sbinet/npyio was considered and not used: its reader slices
// the header at offsets it has not checked, so a crafted header panics it, allocates a
// header of any length a version 2.0 file claims, multiplies the shape without an overflow
// check, and knows no version 3.0.)
package npy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ortbus/ortbus/codec"
)

// Magic opens every .npy file.
const Magic = "\x93NUMPY"

// Limits of Decode.
const (
	// MaxHeaderLen bounds the header (the dict and its padding), in bytes. NumPy writes
	// well under 200 bytes for the types read here; version 1.0 cannot say more than 65535.
	MaxHeaderLen = 1 << 16
	// MaxRank bounds the number of dimensions (NumPy's own NPY_MAXDIMS is 64).
	MaxRank = 64
	// align is the multiple that Encode pads magic, version, length and header to, as
	// NumPy does (64 bytes, so the data can be memory-mapped aligned).
	align = 64
)

// descrs maps the dtype strings read to tensor types; Encode writes the first spelling.
var descrs = map[string]string{
	"<f4": "float32",
	"<f8": "float64",
	"<f2": "float16",
	"<i8": "int64",
	"<i4": "int32",
	"<i2": "int16",
	"|i1": "int8", "<i1": "int8", ">i1": "int8",
	"<u8": "uint64",
	"<u4": "uint32",
	"<u2": "uint16",
	"|u1": "uint8", "<u1": "uint8", ">u1": "uint8",
	"|b1": "bool", "<b1": "bool", ">b1": "bool",
	"<V2": "bfloat16", "|V2": "bfloat16", "bfloat16": "bfloat16",
}

// descrOf is the dtype string Encode writes for a tensor type.
var descrOf = map[string]string{
	"float32": "<f4", "float64": "<f8", "float16": "<f2",
	"int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "|i1",
	"uint64": "<u8", "uint32": "<u4", "uint16": "<u2", "uint8": "|u1", "bool": "|b1",
	"bfloat16": "<V2",
}

// Writable reports whether a tensor of type typ can be written as a .npy file (every
// tensor type: string as '<U{n}', bfloat16 as '<V2').
func Writable(typ string) bool {
	_, ok := descrOf[typ]
	return ok || typ == "string"
}

// Header is what a .npy header declares.
type Header struct {
	Major, Minor int
	Descr        string
	Fortran      bool
	Shape        []int64
	// DataOffset is where the data begins: the length of magic, version, header length
	// and header.
	DataOffset int
}

// Decode reads a whole .npy file held in data as a tensor. The tensor's Data is a slice of
// data, not a copy (a string tensor's Strings are decoded, in one allocation).
func Decode(data []byte) (*codec.Tensor, error) {
	h, err := ParseHeader(data)
	if err != nil {
		return nil, err
	}
	width, isUnicode, err := unicodeLen(h.Descr)
	if err != nil {
		return nil, err
	}
	typ, ok := descrs[h.Descr]
	if !ok && !isUnicode {
		return nil, unsupported(h.Descr)
	}
	if h.Fortran && !sameInCOrder(h.Shape) {
		return nil, errors.New("fortran_order is True: only C-order arrays are read (save with np.ascontiguousarray, or np.save of a C-contiguous array)")
	}
	if isUnicode {
		return decodeUnicode(data, h, width)
	}
	n, err := codec.Elements(h.Shape)
	if err != nil {
		return nil, err
	}
	size := int64(codec.ElemSize(typ))
	body := int64(len(data) - h.DataOffset)
	if want := n * size; body != want {
		return nil, fmt.Errorf("the header declares %s %v (%d bytes of data), but the file holds %d bytes of data", typ, h.Shape, want, body)
	}
	t := &codec.Tensor{Type: typ, Shape: h.Shape, Data: data[h.DataOffset:len(data):len(data)]}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// ParseHeader reads the magic, the version, the header length and the header dict at the
// start of data, and checks the dict's form: exactly the keys 'descr' (a string),
// 'fortran_order' (True or False) and 'shape' (a tuple of non-negative integers, at most
// MaxRank of them). It does not look at the dtype or at the data.
func ParseHeader(data []byte) (*Header, error) {
	if len(data) < len(Magic)+2 || string(data[:len(Magic)]) != Magic {
		return nil, errors.New("not a .npy file (no \\x93NUMPY magic)")
	}
	h := &Header{Major: int(data[6]), Minor: int(data[7])}
	var hlen, start int
	switch {
	case h.Major == 1 && h.Minor == 0:
		if len(data) < 10 {
			return nil, errors.New("truncated header length")
		}
		hlen, start = int(binary.LittleEndian.Uint16(data[8:])), 10
	case (h.Major == 2 || h.Major == 3) && h.Minor == 0:
		if len(data) < 12 {
			return nil, errors.New("truncated header length")
		}
		n := binary.LittleEndian.Uint32(data[8:])
		if n > MaxHeaderLen {
			return nil, fmt.Errorf("header length %d is over the limit of %d bytes", n, MaxHeaderLen)
		}
		hlen, start = int(n), 12
	default:
		return nil, fmt.Errorf("format version %d.%d is not one of 1.0, 2.0, 3.0", h.Major, h.Minor)
	}
	if hlen > len(data)-start {
		return nil, fmt.Errorf("header length %d is more than the %d bytes that follow it", hlen, len(data)-start)
	}
	h.DataOffset = start + hlen
	p := parser{b: data[start:h.DataOffset]}
	if err := p.dict(h); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	return h, nil
}

// sameInCOrder reports whether a Fortran-order array of shape has the same bytes as in C
// order: at most one dimension larger than 1.
func sameInCOrder(shape []int64) bool {
	big := 0
	for _, d := range shape {
		if d > 1 {
			big++
		}
	}
	return big <= 1
}

func unsupported(descr string) error {
	return fmt.Errorf("dtype %q is not supported (the tensor types are float32 '<f4', float64 '<f8', float16 '<f2', int64 '<i8', int32 '<i4', int16 '<i2', int8 '|i1', uint64 '<u8', uint32 '<u4', uint16 '<u2', uint8 '|u1', bool '|b1', bfloat16 '<V2', string '<U{n}'; big-endian data and other types must be converted first)", descr)
}

// parser reads the header dict, a Python literal of a fixed form:
//
//	{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3, 640, 640), }
//
// followed by padding (spaces, ending with a newline). Strings are single- or double-quoted
// without escapes; integers may carry Python 2's L suffix.
type parser struct {
	b []byte
	i int
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// peek returns the next byte after white space, or 0 at the end.
func (p *parser) peek() byte {
	p.ws()
	if p.i >= len(p.b) {
		return 0
	}
	return p.b[p.i]
}

func (p *parser) expect(c byte) error {
	if got := p.peek(); got != c {
		return p.errf("expected %q, found %s", c, p.what())
	}
	p.i++
	return nil
}

// what describes the byte at the parser's position, for messages.
func (p *parser) what() string {
	if p.i >= len(p.b) {
		return "the end of the header"
	}
	return strconv.QuoteRune(rune(p.b[p.i]))
}

func (p *parser) errf(format string, args ...any) error {
	return fmt.Errorf("at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *parser) dict(h *Header) error {
	if err := p.expect('{'); err != nil {
		return err
	}
	seen := map[string]bool{}
	for p.peek() != '}' {
		key, err := p.str()
		if err != nil {
			return err
		}
		if seen[key] {
			return p.errf("key %q appears twice", key)
		}
		seen[key] = true
		if err := p.expect(':'); err != nil {
			return err
		}
		switch key {
		case "descr":
			if p.peek() != '\'' && p.peek() != '"' {
				return p.errf("descr is not a string (structured and subarray dtypes are not supported)")
			}
			if h.Descr, err = p.str(); err != nil {
				return err
			}
		case "fortran_order":
			if h.Fortran, err = p.boolean(); err != nil {
				return err
			}
		case "shape":
			if h.Shape, err = p.tuple(); err != nil {
				return err
			}
		default:
			return p.errf("unknown key %q (a .npy header has only descr, fortran_order and shape)", key)
		}
		if p.peek() == ',' {
			p.i++
		} else if p.peek() != '}' {
			return p.errf("expected ',' or '}', found %s", p.what())
		}
	}
	p.i++ // '}'
	if p.ws(); p.i != len(p.b) {
		return p.errf("%s after the dict", p.what())
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if !seen[k] {
			return fmt.Errorf("key %q is missing", k)
		}
	}
	return nil
}

// str reads a quoted string without escapes, of printable ASCII.
func (p *parser) str() (string, error) {
	q := p.peek()
	if q != '\'' && q != '"' {
		return "", p.errf("expected a string, found %s", p.what())
	}
	p.i++
	start := p.i
	for p.i < len(p.b) && p.b[p.i] != q {
		if c := p.b[p.i]; c < ' ' || c > '~' || c == '\\' {
			return "", p.errf("a string holds byte %#x (only printable ASCII without escapes is read)", c)
		}
		p.i++
	}
	if p.i >= len(p.b) {
		return "", p.errf("unterminated string")
	}
	s := string(p.b[start:p.i])
	p.i++
	return s, nil
}

func (p *parser) boolean() (bool, error) {
	p.ws()
	rest := p.b[p.i:]
	for _, v := range []string{"True", "False"} {
		if len(rest) >= len(v) && string(rest[:len(v)]) == v {
			p.i += len(v)
			return v == "True", nil
		}
	}
	return false, p.errf("fortran_order is not True or False")
}

// tuple reads a tuple of non-negative integers: (), (n,), (a, b), with an optional trailing
// comma.
func (p *parser) tuple() ([]int64, error) {
	if err := p.expect('('); err != nil {
		return nil, fmt.Errorf("shape is not a tuple: %w", err)
	}
	shape := []int64{}
	for p.peek() != ')' {
		if len(shape) == MaxRank {
			return nil, p.errf("shape has more than %d dimensions", MaxRank)
		}
		d, err := p.integer()
		if err != nil {
			return nil, err
		}
		shape = append(shape, d)
		if p.peek() == ',' {
			p.i++
		} else if p.peek() != ')' {
			return nil, p.errf("expected ',' or ')' in shape, found %s", p.what())
		}
	}
	p.i++ // ')'
	return shape, nil
}

// integer reads a non-negative decimal integer (an optional L suffix) that fits an int64.
func (p *parser) integer() (int64, error) {
	p.ws()
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	if p.i == start {
		return 0, p.errf("a shape dimension is not a non-negative integer (found %s)", p.what())
	}
	d, err := strconv.ParseInt(string(p.b[start:p.i]), 10, 64)
	if err != nil {
		return 0, p.errf("shape dimension %s is too large", p.b[start:p.i])
	}
	if p.i < len(p.b) && p.b[p.i] == 'L' {
		p.i++
	}
	return d, nil
}

// HeaderOf returns the bytes Encode puts before a tensor's data: magic, version (1.0, or
// 2.0 for a header over 65535 bytes), header length and the header dict padded with spaces
// and a newline to a multiple of 64 bytes. The tensor must be valid, of at most MaxRank
// dimensions (so that Decode reads back whatever Encode writes).
func HeaderOf(t *codec.Tensor) ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	descr, ok := descrOf[t.Type]
	if t.Type == "string" {
		width, err := unicodeWidth(t)
		if err != nil {
			return nil, err
		}
		descr, ok = "<U"+strconv.FormatInt(width, 10), true
	}
	if !ok {
		return nil, fmt.Errorf("tensor type %q has no .npy dtype", t.Type)
	}
	if len(t.Shape) > MaxRank {
		return nil, fmt.Errorf("tensor shape has %d dimensions, over the limit of %d", len(t.Shape), MaxRank)
	}
	var b strings.Builder
	b.WriteString("{'descr': '")
	b.WriteString(descr)
	b.WriteString("', 'fortran_order': False, 'shape': (")
	for i, d := range t.Shape {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(d, 10))
	}
	if len(t.Shape) == 1 {
		b.WriteByte(',')
	}
	b.WriteString("), }")
	dict := b.String()
	for _, v := range []struct {
		major byte
		start int
	}{{1, 10}, {2, 12}} {
		hlen := dict + " "
		total := v.start + len(hlen) + 1 // + the newline
		if pad := (align - total%align) % align; pad > 0 {
			hlen += strings.Repeat(" ", pad)
		}
		hlen += "\n"
		if v.major == 1 && len(hlen) > 0xffff {
			continue
		}
		out := make([]byte, v.start, v.start+len(hlen))
		copy(out, Magic)
		out[6], out[7] = v.major, 0
		if v.major == 1 {
			binary.LittleEndian.PutUint16(out[8:], uint16(len(hlen)))
		} else {
			binary.LittleEndian.PutUint32(out[8:], uint32(len(hlen)))
		}
		return append(out, hlen...), nil
	}
	return nil, errors.New("unreachable: a header too long for version 2.0")
}

// DataOf returns the bytes Encode puts after the header: t.Data as it is, or for a string
// tensor its elements as UTF-32LE padded to the longest (the '<U{n}' that HeaderOf names).
// t must have passed HeaderOf.
func DataOf(t *codec.Tensor) []byte {
	if t.Type != "string" {
		return t.Data
	}
	width, err := unicodeWidth(t)
	if err != nil {
		return nil // HeaderOf refused it
	}
	return unicodeData(t, width)
}

// Write writes t to w as a .npy file (HeaderOf, then DataOf).
func Write(w io.Writer, t *codec.Tensor) error {
	h, err := HeaderOf(t)
	if err != nil {
		return err
	}
	if _, err := w.Write(h); err != nil {
		return err
	}
	_, err = w.Write(DataOf(t))
	return err
}

// Encode returns t as the bytes of a .npy file.
func Encode(t *codec.Tensor) ([]byte, error) {
	h, err := HeaderOf(t)
	if err != nil {
		return nil, err
	}
	return append(h, DataOf(t)...), nil
}
