package npy

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ortbus/ortbus/codec"
)

// String tensors are NumPy's fixed-width unicode arrays, dtype '<U{n}': each element n
// UTF-32LE code units (4n bytes), shorter strings padded with NUL code points, which
// NumPy strips when it reads them (so a string cannot end with U+0000 here either).
// Every element decoded is checked: a code unit over U+10FFFF or a surrogate
// (U+D800-U+DFFF) refuses the file. Decode allocates the elements as one string and the
// []string (16 bytes an element, and an element takes at least 4 bytes of the file), so
// at most about 5 times the file it was given.

// Limits of the unicode dtype.
const (
	// MaxUnicodeLen bounds n in '<U{n}' (code points an element): 2^26, 256 MiB of data
	// for one element, codec.MaxStringBytes.
	MaxUnicodeLen = codec.MaxStringBytes / 4
	// MaxUnicodeData bounds the data Encode writes for a string tensor (every element
	// padded to the longest): 1 GiB.
	MaxUnicodeData = 1 << 30
)

// unicodeLen reads n from a '<U{n}' dtype: ok false when descr is not that form (another
// dtype), an error when it is but n is not 1 to MaxUnicodeLen.
func unicodeLen(descr string) (n int64, ok bool, err error) {
	digits, found := strings.CutPrefix(descr, "<U")
	if !found {
		return 0, false, nil
	}
	if digits == "" || len(digits) > 12 || strings.Trim(digits, "0123456789") != "" {
		return 0, true, fmt.Errorf("dtype %q: the unicode itemsize is not a decimal number", descr)
	}
	n, _ = strconv.ParseInt(digits, 10, 64) // 12 digits always fit
	if n < 1 || n > MaxUnicodeLen {
		return 0, true, fmt.Errorf("dtype %q: a unicode element of %d code points is outside 1 to %d", descr, n, MaxUnicodeLen)
	}
	return n, true, nil
}

// decodeUnicode reads the data of a '<U{width}' array of count elements: exactly
// count*4*width bytes.
func decodeUnicode(data []byte, h *Header, width int64) (*codec.Tensor, error) {
	n, err := codec.Elements(h.Shape)
	if err != nil {
		return nil, err
	}
	body := data[h.DataOffset:]
	// n <= 2^28 and 4*width <= 2^28: the product fits an int64.
	if want := n * 4 * width; int64(len(body)) != want {
		return nil, fmt.Errorf("the header declares %s %v (%d bytes of data), but the file holds %d bytes of data", h.Descr, h.Shape, want, len(body))
	}
	item := int(4 * width)
	utf := make([]byte, 0, len(body)) // a code point is at most 4 bytes in UTF-8 too
	ends := make([]int, n)
	for i := range ends {
		units := body[i*item : (i+1)*item]
		end := len(units)
		for end > 0 && binary.LittleEndian.Uint32(units[end-4:]) == 0 {
			end -= 4 // NumPy's padding
		}
		for k := 0; k < end; k += 4 {
			r := binary.LittleEndian.Uint32(units[k:])
			if r > utf8.MaxRune || r >= 0xd800 && r <= 0xdfff {
				return nil, fmt.Errorf("element %d holds %#x at code point %d, which is not a Unicode scalar value (over U+10FFFF, or a surrogate)", i, r, k/4)
			}
			utf = utf8.AppendRune(utf, rune(r))
		}
		ends[i] = len(utf)
	}
	all := string(utf)
	strs := make([]string, n)
	start := 0
	for i, end := range ends {
		strs[i] = all[start:end]
		start = end
	}
	t := &codec.Tensor{Type: "string", Shape: h.Shape, Strings: strs}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// unicodeWidth is the n of the '<U{n}' dtype Encode writes for t's strings: the most code
// points of an element (at least 1, as NumPy), with the data that makes checked against
// MaxUnicodeData; an element ending with U+0000 is refused (NumPy would read it back
// without).
func unicodeWidth(t *codec.Tensor) (int64, error) {
	width := int64(1)
	for i, s := range t.Strings {
		if strings.HasSuffix(s, "\x00") {
			return 0, fmt.Errorf("string %d ends with U+0000, which a NumPy unicode array cannot hold (it strips trailing NULs)", i)
		}
		width = max(width, int64(utf8.RuneCountInString(s)))
	}
	if width > MaxUnicodeLen || int64(len(t.Strings))*4*width > MaxUnicodeData {
		return 0, fmt.Errorf("the .npy data of %d strings of up to %d code points would be over the limit of %d bytes", len(t.Strings), width, MaxUnicodeData)
	}
	return width, nil
}

// unicodeData is the data of t's strings as '<U{width}': UTF-32LE, NUL-padded.
func unicodeData(t *codec.Tensor, width int64) []byte {
	item := int(4 * width)
	out := make([]byte, len(t.Strings)*item)
	for i, s := range t.Strings {
		b := out[i*item:]
		k := 0
		for _, r := range s {
			binary.LittleEndian.PutUint32(b[k:], uint32(r))
			k += 4
		}
	}
	return out
}
