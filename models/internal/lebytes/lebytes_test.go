package lebytes

import (
	"encoding/binary"
	"math"
	"testing"
	"unsafe"
)

// TestView: the elements of little-endian bytes, the same memory when aligned, a copy
// (with the same values) when not; Bytes the inverse.
func TestView(t *testing.T) {
	want := []float32{1.5, -2, float32(math.Inf(1)), 0}
	b, _ := binary.Append(nil, binary.LittleEndian, want)
	buf := make([]byte, len(b)+1) // room to misalign
	copy(buf, b)
	v := View[float32](buf[:len(b)])
	for i := range want {
		if v[i] != want[i] {
			t.Fatalf("view = %v, want %v", v, want)
		}
	}
	if little && unsafe.Pointer(&v[0]) != unsafe.Pointer(&buf[0]) {
		t.Error("an aligned view on a little-endian host is a copy")
	}
	copy(buf[1:], b)
	mis := View[float32](buf[1 : 1+len(b)])
	for i := range want {
		if mis[i] != want[i] {
			t.Fatalf("misaligned view = %v, want %v", mis, want)
		}
	}
	if unsafe.Pointer(&mis[0]) == unsafe.Pointer(&buf[1]) {
		t.Error("a misaligned view shares memory")
	}
	if got := Bytes(want); string(got) != string(b) {
		t.Fatalf("Bytes = %x, want %x", got, b)
	}
	if len(View[int64]([]byte{1, 2, 3})) != 0 || len(Bytes([]int16{})) != 0 {
		t.Error("empty cases")
	}
	i64 := View[int64](b[:8])
	if i64[0] != int64(binary.LittleEndian.Uint64(b)) {
		t.Error("int64 view")
	}
}

// BenchmarkView: a 640×640×3 float32 image (4.9 MB) as elements, view against the
// element-wise decode it replaces.
func BenchmarkView(b *testing.B) {
	buf := make([]byte, 640*640*3*4)
	b.Run("view", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			_ = View[float32](buf)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			v := make([]float32, len(buf)/4)
			for i := range v {
				v[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
			}
		}
	})
}
