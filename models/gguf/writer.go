// Package gguf writes (and reads back the header of) GGUF v3 files, the model format of
// llama.cpp, and generates a llama-architecture model with deterministic random weights
// (llama.go): the real LLM engine of the tests and benches (tenants/llm) serves it, so no
// model is downloaded.
//
// A GGUF v3 file is, little-endian throughout: "GGUF", the version (uint32 3), the tensor
// count and the metadata count (uint64 each); the metadata (key, value type, value); the
// tensor infos (name, dimension count, dimensions innermost first, ggml type, offset in
// the data section); padding to the alignment; the data section, each tensor at an
// offset that is a multiple of the alignment (general.alignment, 32 by default).
package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// Magic and Version are what a GGUF v3 file starts with.
const (
	Magic   = "GGUF"
	Version = 3
	// DefaultAlignment is the data alignment llama.cpp assumes without general.alignment.
	DefaultAlignment = 32
)

// ValueType is a metadata value's type code.
type ValueType uint32

// The metadata value types of GGUF v3.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

// TensorType is a tensor's ggml type; only the unquantized float types are written here.
type TensorType uint32

// The tensor types the generator writes.
const (
	F32 TensorType = 0
	F16 TensorType = 1
)

// ElemSize is the bytes of one element of t, 0 for a type this package does not know.
func (t TensorType) ElemSize() uint64 {
	switch t {
	case F32:
		return 4
	case F16:
		return 2
	}
	return 0
}

// KV is one metadata entry. Value is one of uint8, int8, uint16, int16, uint32, int32,
// float32, bool, string, uint64, int64, float64, or a slice of one of them (an array;
// arrays of arrays are not written).
type KV struct {
	Key   string
	Value any
}

// Tensor is one tensor to write: Dims innermost first (ggml's ne), Fill writes its bytes
// (len(dst) is Bytes()) when the data section is written, so a large file is never
// whole in memory.
type Tensor struct {
	Name string
	Dims []uint64
	Type TensorType
	Fill func(dst []byte)
}

// Elems is the element count of t.
func (t *Tensor) Elems() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Bytes is the size of t's data.
func (t *Tensor) Bytes() uint64 { return t.Elems() * t.Type.ElemSize() }

// File is a whole GGUF file: metadata and tensors, in the order written. Alignment 0 is
// DefaultAlignment (a general.alignment entry, if any, must agree with it).
type File struct {
	KVs       []KV
	Tensors   []Tensor
	Alignment uint64
}

func (f *File) alignment() uint64 {
	if f.Alignment == 0 {
		return DefaultAlignment
	}
	return f.Alignment
}

func align(n, a uint64) uint64 { return (n + a - 1) / a * a }

// Size is the size of the file f writes (the last tensor padded to the alignment too,
// as gguf-py writes it).
func (f *File) Size() (uint64, error) {
	cw := &countWriter{}
	if err := f.writeHeader(cw, nil); err != nil {
		return 0, err
	}
	n := align(cw.n, f.alignment())
	for i := range f.Tensors {
		n = align(n, f.alignment()) + f.Tensors[i].Bytes()
	}
	return align(n, f.alignment()), nil
}

// WriteTo writes f to w.
func (f *File) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	if err := f.write(cw); err != nil {
		return int64(cw.n), err
	}
	return int64(cw.n), nil
}

// WriteFile writes f to path through a temporary file in the same directory renamed
// over path at the end, so a reader never sees half a model.
func (f *File) WriteFile(path string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".part-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if _, err = f.WriteTo(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = tmp.Chmod(0o644); err != nil { // CreateTemp's 0600 would hide the model from other users
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func (f *File) write(cw *countWriter) error {
	a := f.alignment()
	offsets := make([]uint64, len(f.Tensors))
	var off uint64
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if t.Type.ElemSize() == 0 {
			return fmt.Errorf("gguf: tensor %s: unsupported type %d", t.Name, t.Type)
		}
		if t.Fill == nil {
			return fmt.Errorf("gguf: tensor %s has no Fill", t.Name)
		}
		off = align(off, a)
		offsets[i] = off
		off += t.Bytes()
	}
	if err := f.writeHeader(cw, offsets); err != nil {
		return err
	}
	base := align(cw.n, a)
	for i := range f.Tensors {
		if err := cw.pad(base + offsets[i]); err != nil {
			return err
		}
		t := &f.Tensors[i]
		buf := make([]byte, t.Bytes())
		t.Fill(buf)
		if _, err := cw.Write(buf); err != nil {
			return err
		}
	}
	return cw.pad(align(cw.n, a))
}

// writeHeader writes everything before the data section's padding; offsets nil writes
// zeros (for Size, where only the length matters).
func (f *File) writeHeader(w *countWriter, offsets []uint64) error {
	e := &enc{w: w}
	e.raw([]byte(Magic))
	e.u32(Version)
	e.u64(uint64(len(f.Tensors)))
	e.u64(uint64(len(f.KVs)))
	for _, kv := range f.KVs {
		e.str(kv.Key)
		if err := e.value(kv.Value); err != nil {
			return fmt.Errorf("gguf: metadata %s: %w", kv.Key, err)
		}
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		var off uint64
		if offsets != nil {
			off = offsets[i]
		}
		e.u64(off)
	}
	return e.err
}

// enc writes little-endian values, keeping the first error.
type enc struct {
	w   io.Writer
	err error
	b   [8]byte
}

func (e *enc) raw(p []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(p)
	}
}
func (e *enc) u8(v uint8)   { e.raw([]byte{v}) }
func (e *enc) u16(v uint16) { binary.LittleEndian.PutUint16(e.b[:], v); e.raw(e.b[:2]) }
func (e *enc) u32(v uint32) { binary.LittleEndian.PutUint32(e.b[:], v); e.raw(e.b[:4]) }
func (e *enc) u64(v uint64) { binary.LittleEndian.PutUint64(e.b[:], v); e.raw(e.b[:8]) }
func (e *enc) str(s string) { e.u64(uint64(len(s))); e.raw([]byte(s)) }

// value writes v's type code and v.
func (e *enc) value(v any) error {
	if t, ok := scalarType(v); ok {
		e.u32(uint32(t))
		e.scalar(v)
		return nil
	}
	elems, t, ok := arrayElems(v)
	if !ok {
		return fmt.Errorf("unsupported value type %T", v)
	}
	e.u32(uint32(TypeArray))
	e.u32(uint32(t))
	e.u64(uint64(len(elems)))
	for _, x := range elems {
		e.scalar(x)
	}
	return nil
}

func (e *enc) scalar(v any) {
	switch x := v.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case bool:
		var b uint8
		if x {
			b = 1
		}
		e.u8(b)
	case string:
		e.str(x)
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	}
}

// scalarType is v's type code when v is a scalar value.
func scalarType(v any) (ValueType, bool) {
	switch v.(type) {
	case uint8:
		return TypeUint8, true
	case int8:
		return TypeInt8, true
	case uint16:
		return TypeUint16, true
	case int16:
		return TypeInt16, true
	case uint32:
		return TypeUint32, true
	case int32:
		return TypeInt32, true
	case float32:
		return TypeFloat32, true
	case bool:
		return TypeBool, true
	case string:
		return TypeString, true
	case uint64:
		return TypeUint64, true
	case int64:
		return TypeInt64, true
	case float64:
		return TypeFloat64, true
	}
	return 0, false
}

// arrayElems is v's elements and their type code when v is a slice of a scalar type.
func arrayElems(v any) ([]any, ValueType, bool) {
	switch x := v.(type) {
	case []uint8:
		return boxed(x), TypeUint8, true
	case []int8:
		return boxed(x), TypeInt8, true
	case []uint16:
		return boxed(x), TypeUint16, true
	case []int16:
		return boxed(x), TypeInt16, true
	case []uint32:
		return boxed(x), TypeUint32, true
	case []int32:
		return boxed(x), TypeInt32, true
	case []float32:
		return boxed(x), TypeFloat32, true
	case []bool:
		return boxed(x), TypeBool, true
	case []string:
		return boxed(x), TypeString, true
	case []uint64:
		return boxed(x), TypeUint64, true
	case []int64:
		return boxed(x), TypeInt64, true
	case []float64:
		return boxed(x), TypeFloat64, true
	}
	return nil, 0, false
}

func boxed[T any](s []T) []any {
	out := make([]any, len(s))
	for i, x := range s {
		out[i] = x
	}
	return out
}

// countWriter counts what goes through it; w nil discards.
type countWriter struct {
	w io.Writer
	n uint64
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.w == nil {
		c.n += uint64(len(p))
		return len(p), nil
	}
	n, err := c.w.Write(p)
	c.n += uint64(n)
	return n, err
}

var zeros [DefaultAlignment * 8]byte

// pad writes zeros up to offset to.
func (c *countWriter) pad(to uint64) error {
	for c.n < to {
		k := min(to-c.n, uint64(len(zeros)))
		if _, err := c.Write(zeros[:k]); err != nil {
			return err
		}
	}
	return nil
}
