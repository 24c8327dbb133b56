// Package lebytes views a tensor's little-endian bytes as its Go elements, and elements
// as bytes, without a copy where the host allows it: on a little-endian host (every host
// ortbus runs on: amd64, arm64) with the bytes aligned for the element type, the view
// shares the memory; elsewhere it is a decoded copy (encoding/binary). A view aliases
// its source: neither may be changed while the other is in use.
package lebytes

import (
	"encoding/binary"
	"unsafe"
)

// Elem is a fixed-size element type whose every bit pattern is a valid value (bool is
// not: a byte other than 0 and 1 is no Go bool, so bools are always copied by callers).
type Elem interface {
	~float32 | ~float64 | ~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64
}

// little reports whether this host stores integers little-endian.
var little = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// View returns the elements of b (little-endian, len(b) a multiple of the element's
// size; a trailing partial element is dropped) sharing b's memory when it can, else
// decoded into a new slice.
func View[T Elem](b []byte) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	n := len(b) / size
	if n == 0 {
		return []T{}
	}
	if little && uintptr(unsafe.Pointer(&b[0]))%unsafe.Alignof(zero) == 0 {
		return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
	}
	v := make([]T, n)
	binary.Decode(b[:n*size], binary.LittleEndian, v)
	return v
}

// Bytes returns d's elements as little-endian bytes, sharing d's memory on a
// little-endian host, else encoded into a new slice.
func Bytes[T Elem](d []T) []byte {
	if len(d) == 0 {
		return []byte{}
	}
	var zero T
	if little {
		return unsafe.Slice((*byte)(unsafe.Pointer(&d[0])), len(d)*int(unsafe.Sizeof(zero)))
	}
	b, _ := binary.Append(nil, binary.LittleEndian, d)
	return b
}

// Shared reports whether View and Bytes share memory on this host (little-endian).
func Shared() bool { return little }
