package codec

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// FloatVec is a float32 vector (an embedding, a CCIP feature). In msgpack it travels as
// bin holding little-endian float32s (4 bytes a value, and ~10x cheaper to encode than an
// array); on input it is also accepted as an array of float32, float64 or integers, since
// a JavaScript number array encodes as float64. In JSON it is a number array.
type FloatVec []float32

// EncodeMsgpack writes v as bin of little-endian float32.
func (v FloatVec) EncodeMsgpack(enc *msgpack.Encoder) error {
	if v == nil {
		return enc.EncodeNil()
	}
	return enc.EncodeBytes(Float32Bytes(v))
}

// DecodeMsgpack reads a bin of little-endian float32, or a number array.
func (v *FloatVec) DecodeMsgpack(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case c == msgpcode.Nil:
		*v = nil
		return dec.DecodeNil()
	case msgpcode.IsBin(c):
		b, err := dec.DecodeBytes()
		if err != nil {
			return err
		}
		f, err := BytesFloat32(b)
		if err != nil {
			return err
		}
		*v = f
		return nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		if n > maxVecLen {
			return fmt.Errorf("float vector of %d values is over the limit of %d", n, maxVecLen)
		}
		out := make([]float32, 0, min(n, 4096))
		for i := 0; i < n; i++ {
			f, err := dec.DecodeFloat64()
			if err != nil {
				return fmt.Errorf("float vector value %d: %w", i, err)
			}
			out = append(out, float32(f))
		}
		*v = out
		return nil
	}
	return fmt.Errorf("float vector: want bin or number array, got msgpack code 0x%02x", c)
}

// maxVecLen bounds a float vector read from untrusted input.
const maxVecLen = 1 << 24

// Float32Bytes encodes float32s as little-endian bytes.
func Float32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// BytesFloat32 decodes little-endian float32 bytes; the length must be a multiple of 4.
func BytesFloat32(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("float32 bin of %d bytes is not a multiple of 4", len(b))
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, nil
}
