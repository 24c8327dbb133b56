package images

import (
	"image"
	"image/color"
	"math"
	"math/rand/v2"
	"testing"
)

// quad is a 2x2 image: black, white / red, (10, 20, 30).
func quad() *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, 2, 2))
	img.SetRGBA(0, 0, color.RGBA{0, 0, 0, 255})
	img.SetRGBA(1, 0, color.RGBA{255, 255, 255, 255})
	img.SetRGBA(0, 1, color.RGBA{255, 0, 0, 255})
	img.SetRGBA(1, 1, color.RGBA{10, 20, 30, 255})
	return img
}

func closeTo(a, b float32) bool { return math.Abs(float64(a-b)) < 1e-6 }

func checkValues(t *testing.T, name string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range want {
		if !closeTo(got[i], want[i]) {
			t.Fatalf("%s: value %d = %v, want %v\n got  %v\n want %v", name, i, got[i], want[i], got, want)
		}
	}
}

func TestToCHW(t *testing.T) {
	img := quad()
	// (x/255 - 0.5) / 0.5: black -1, white +1, RGB planes.
	dst := make([]float32, 12)
	ToCHW(img, dst, HalfMean, HalfStd, Scale255, false)
	checkValues(t, "half RGB", dst, []float32{
		-1, 1, 1, 10.0/127.5 - 1, // R plane: black, white, red, 10
		-1, 1, -1, 20.0/127.5 - 1, // G
		-1, 1, -1, 30.0/127.5 - 1, // B
	})
	// Raw BGR: planes B, G, R.
	ToCHW(img, dst, ZeroMean, UnitStd, 1, true)
	checkValues(t, "raw BGR", dst, []float32{
		0, 255, 0, 30,
		0, 255, 0, 20,
		0, 255, 255, 10,
	})
	// Per-channel statistics follow the tensor's channel order.
	mean, std := [3]float32{1, 2, 3}, [3]float32{2, 4, 8}
	ToCHW(img, dst, mean, std, 1, true)
	checkValues(t, "stats BGR", dst, []float32{
		(0 - 1) / 2.0, (255 - 1) / 2.0, (0 - 1) / 2.0, (30 - 1) / 2.0,
		(0 - 2) / 4.0, (255 - 2) / 4.0, (0 - 2) / 4.0, (20 - 2) / 4.0,
		(0 - 3) / 8.0, (255 - 3) / 8.0, (255 - 3) / 8.0, (10 - 3) / 8.0,
	})
	// CLIP statistics (CCIP) on white.
	ToCHW(img, dst, ClipMean, ClipStd, Scale255, false)
	for c := range 3 {
		want := (1 - ClipMean[c]) / ClipStd[c]
		if got := dst[c*4+1]; !closeTo(got, want) {
			t.Errorf("CLIP white channel %d = %v, want %v", c, got, want)
		}
	}
}

func TestToHWC(t *testing.T) {
	img := quad()
	dst := make([]float32, 12)
	// WD14: BGR, raw 0-255.
	ToHWC(img, dst, ZeroMean, UnitStd, 1, true)
	checkValues(t, "raw BGR", dst, []float32{
		0, 0, 0, 255, 255, 255,
		0, 0, 255, 30, 20, 10,
	})
	ToHWC(img, dst, HalfMean, HalfStd, Scale255, false)
	checkValues(t, "half RGB", dst, []float32{
		-1, -1, -1, 1, 1, 1,
		1, -1, -1, 10.0/127.5 - 1, 20.0/127.5 - 1, 30.0/127.5 - 1,
	})
}

// TestTensorSubImage: a sub-image (non-zero origin, stride wider than the row) packs the
// same as a copy of it.
func TestTensorSubImage(t *testing.T) {
	big := randomRGBA(9, 7, 1)
	sub := big.SubImage(image.Rect(2, 3, 7, 6)).(*image.RGBA)
	cp := FlattenOn(sub, White) // opaque, so a plain copy at origin (0,0)
	for _, pack := range []func(*image.RGBA, []float32, [3]float32, [3]float32, float32, bool){ToCHW, ToHWC} {
		for _, bgr := range []bool{false, true} {
			a, b := make([]float32, 45), make([]float32, 45)
			pack(sub, a, ClipMean, ClipStd, Scale255, bgr)
			pack(cp, b, ClipMean, ClipStd, Scale255, bgr)
			checkValues(t, "sub-image", a, b)
		}
	}
}

// TestTensorBatchSlot: packing into a slot of a batch leaves the rest alone.
func TestTensorBatchSlot(t *testing.T) {
	img := quad()
	batch := make([]float32, 3*12)
	for i := range batch {
		batch[i] = 42
	}
	ToCHW(img, batch[12:], ZeroMean, UnitStd, 1, false)
	for i, v := range batch {
		if (i < 12 || i >= 24) && v != 42 {
			t.Fatalf("value %d outside the slot changed to %v", i, v)
		}
	}
}

func TestTensorShortDstPanics(t *testing.T) {
	for name, pack := range map[string]func(*image.RGBA, []float32, [3]float32, [3]float32, float32, bool){"ToCHW": ToCHW, "ToHWC": ToHWC} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s with a short dst did not panic", name)
				}
			}()
			pack(quad(), make([]float32, 11), ZeroMean, UnitStd, 1, false)
		}()
	}
}

func randomRGBA(w, h int, seed uint64) *image.RGBA {
	r := rand.New(rand.NewPCG(seed, seed))
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = uint8(r.UintN(256))
		if i%4 == 3 {
			img.Pix[i] = 255
		}
	}
	return img
}

func BenchmarkToCHW448(b *testing.B) {
	img := randomRGBA(448, 448, 7)
	dst := make([]float32, 3*448*448)
	b.SetBytes(int64(len(img.Pix)))
	b.ReportAllocs()
	for b.Loop() {
		ToCHW(img, dst, HalfMean, HalfStd, Scale255, false)
	}
}

func BenchmarkToHWC448BGR(b *testing.B) {
	img := randomRGBA(448, 448, 7)
	dst := make([]float32, 3*448*448)
	b.SetBytes(int64(len(img.Pix)))
	b.ReportAllocs()
	for b.Loop() {
		ToHWC(img, dst, ZeroMean, UnitStd, 1, true)
	}
}
