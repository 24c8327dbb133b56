package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Limits bound what ReadHeader accepts: a GGUF file is input like any other, and a forged
// count must not make the reader allocate without end.
type Limits struct {
	MaxKVs       uint64 // metadata entries
	MaxTensors   uint64 // tensor infos
	MaxString    uint64 // bytes of one string (a key, a value, a tensor name)
	MaxArray     uint64 // elements of one array
	MaxDims      uint32 // dimensions of one tensor (ggml has 4)
	MaxTotalMeta uint64 // bytes of all metadata and tensor infos together
}

// DefaultLimits fit every model this package writes with room to spare, and real models
// with vocabularies of a few hundred thousand tokens.
var DefaultLimits = Limits{
	MaxKVs:       4096,
	MaxTensors:   65536,
	MaxString:    1 << 16,
	MaxArray:     1 << 20,
	MaxDims:      4,
	MaxTotalMeta: 256 << 20,
}

// ErrFormat is wrapped by every error about the bytes read (not about the reading).
var ErrFormat = errors.New("gguf: malformed file")

// TensorInfo is one tensor's entry in the header; Offset is relative to the data section.
type TensorInfo struct {
	Name   string
	Dims   []uint64
	Type   TensorType
	Offset uint64
}

// Header is what precedes the tensor data: metadata in file order (values typed as KV
// documents, arrays as slices), tensor infos, and where the data section starts.
type Header struct {
	Version    uint32
	KVs        []KV
	Tensors    []TensorInfo
	DataOffset uint64
}

// Get is the value of the metadata key, or nil.
func (h *Header) Get(key string) any {
	for _, kv := range h.KVs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// ReadHeaderFile reads path's header with DefaultLimits.
func ReadHeaderFile(path string) (*Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadHeader(bufio.NewReaderSize(f, 1<<16), DefaultLimits)
}

// ReadHeader reads a GGUF v3 header from r within lim. It never panics on any input; a
// malformed one is an error wrapping ErrFormat.
func ReadHeader(r io.Reader, lim Limits) (*Header, error) {
	d := &dec{r: r, lim: lim}
	magic := d.bytes(4)
	if d.err == nil && string(magic) != Magic {
		return nil, fmt.Errorf("%w: magic %q, want %q", ErrFormat, magic, Magic)
	}
	h := &Header{Version: d.u32()}
	if d.err == nil && h.Version != Version {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrFormat, h.Version, Version)
	}
	nt, nkv := d.u64(), d.u64()
	if d.err == nil && (nt > lim.MaxTensors || nkv > lim.MaxKVs) {
		return nil, fmt.Errorf("%w: %d tensors, %d metadata entries (limits %d, %d)", ErrFormat, nt, nkv, lim.MaxTensors, lim.MaxKVs)
	}
	for i := uint64(0); i < nkv && d.err == nil; i++ {
		k := d.str()
		h.KVs = append(h.KVs, KV{Key: k, Value: d.value()})
	}
	for i := uint64(0); i < nt && d.err == nil; i++ {
		h.Tensors = append(h.Tensors, d.tensorInfo())
	}
	if d.err != nil {
		return nil, d.err
	}
	a := uint64(DefaultAlignment)
	if v, ok := h.Get("general.alignment").(uint32); ok {
		if v == 0 || v&(v-1) != 0 {
			return nil, fmt.Errorf("%w: general.alignment %d is not a power of two", ErrFormat, v)
		}
		a = uint64(v)
	}
	h.DataOffset = align(d.n, a)
	return h, nil
}

// dec reads little-endian values within its limits, keeping the first error.
type dec struct {
	r   io.Reader
	lim Limits
	n   uint64 // bytes read
	err error
}

func (d *dec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrFormat}, args...)...)
	}
}

func (d *dec) bytes(k uint64) []byte {
	if d.err != nil {
		return nil
	}
	if d.n+k > d.lim.MaxTotalMeta || d.n+k < d.n {
		d.fail("header larger than %d bytes", d.lim.MaxTotalMeta)
		return nil
	}
	b := make([]byte, k)
	if _, err := io.ReadFull(d.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			d.fail("truncated at byte %d", d.n)
		} else {
			d.err = err
		}
		return nil
	}
	d.n += k
	return b
}

func (d *dec) u8() uint8 {
	if b := d.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) u16() uint16 {
	if b := d.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *dec) u32() uint32 {
	if b := d.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if b := d.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *dec) str() string {
	n := d.u64()
	if d.err == nil && n > d.lim.MaxString {
		d.fail("string of %d bytes (limit %d)", n, d.lim.MaxString)
	}
	return string(d.bytes(n))
}

func (d *dec) value() any {
	t := ValueType(d.u32())
	if d.err != nil {
		return nil
	}
	if t != TypeArray {
		return d.scalar(t)
	}
	et := ValueType(d.u32())
	n := d.u64()
	if d.err != nil {
		return nil
	}
	if n > d.lim.MaxArray {
		d.fail("array of %d elements (limit %d)", n, d.lim.MaxArray)
		return nil
	}
	switch et {
	case TypeUint8:
		return readArray(d, n, d.u8)
	case TypeInt8:
		return readArray(d, n, func() int8 { return int8(d.u8()) })
	case TypeUint16:
		return readArray(d, n, d.u16)
	case TypeInt16:
		return readArray(d, n, func() int16 { return int16(d.u16()) })
	case TypeUint32:
		return readArray(d, n, d.u32)
	case TypeInt32:
		return readArray(d, n, func() int32 { return int32(d.u32()) })
	case TypeFloat32:
		return readArray(d, n, func() float32 { return math.Float32frombits(d.u32()) })
	case TypeBool:
		return readArray(d, n, d.boolean)
	case TypeString:
		return readArray(d, n, d.str)
	case TypeUint64:
		return readArray(d, n, d.u64)
	case TypeInt64:
		return readArray(d, n, func() int64 { return int64(d.u64()) })
	case TypeFloat64:
		return readArray(d, n, func() float64 { return math.Float64frombits(d.u64()) })
	}
	d.fail("array of value type %d", et)
	return nil
}

// readArray reads n elements with next, stopping at the first error; the slice grows as
// elements arrive, so a forged n costs no more than the bytes really there.
func readArray[T any](d *dec, n uint64, next func() T) []T {
	out := make([]T, 0, min(n, 1024))
	for i := uint64(0); i < n && d.err == nil; i++ {
		out = append(out, next())
	}
	return out
}

func (d *dec) boolean() bool {
	b := d.u8()
	if d.err == nil && b > 1 {
		d.fail("bool byte %d", b)
	}
	return b == 1
}

func (d *dec) scalar(t ValueType) any {
	switch t {
	case TypeUint8:
		return d.u8()
	case TypeInt8:
		return int8(d.u8())
	case TypeUint16:
		return d.u16()
	case TypeInt16:
		return int16(d.u16())
	case TypeUint32:
		return d.u32()
	case TypeInt32:
		return int32(d.u32())
	case TypeFloat32:
		return math.Float32frombits(d.u32())
	case TypeBool:
		return d.boolean()
	case TypeString:
		return d.str()
	case TypeUint64:
		return d.u64()
	case TypeInt64:
		return int64(d.u64())
	case TypeFloat64:
		return math.Float64frombits(d.u64())
	}
	d.fail("value type %d", t)
	return nil
}

func (d *dec) tensorInfo() TensorInfo {
	ti := TensorInfo{Name: d.str()}
	nd := d.u32()
	if d.err == nil && nd > d.lim.MaxDims {
		d.fail("tensor %q has %d dimensions (limit %d)", ti.Name, nd, d.lim.MaxDims)
	}
	for i := uint32(0); i < nd && d.err == nil; i++ {
		ti.Dims = append(ti.Dims, d.u64())
	}
	ti.Type = TensorType(d.u32())
	ti.Offset = d.u64()
	return ti
}
