package images

import (
	"image"
	"image/color"
	"math"
	"testing"

	"golang.org/x/image/draw"
)

func rgbaAt(img *image.RGBA, x, y int) [4]uint8 {
	i := img.PixOffset(x, y)
	return [4]uint8(img.Pix[i : i+4])
}

func TestFlattenOn(t *testing.T) {
	src := image.NewNRGBA(image.Rect(10, 20, 13, 21)) // non-zero origin on purpose
	src.SetNRGBA(10, 20, color.NRGBA{0, 0, 0, 0})     // fully transparent
	src.SetNRGBA(11, 20, color.NRGBA{255, 0, 0, 255}) // opaque red
	src.SetNRGBA(12, 20, color.NRGBA{255, 0, 0, 128}) // half red
	dst := FlattenOn(src, White)
	if dst.Rect != image.Rect(0, 0, 3, 1) {
		t.Fatalf("bounds %v, want origin (0,0)", dst.Rect)
	}
	tests := []struct {
		x    int
		want [4]uint8
	}{
		{0, [4]uint8{255, 255, 255, 255}},
		{1, [4]uint8{255, 0, 0, 255}},
		{2, [4]uint8{255, 127, 127, 255}},
	}
	for _, tt := range tests {
		got := rgbaAt(dst, tt.x, 0)
		for i := range 4 {
			if d := int(got[i]) - int(tt.want[i]); d < -1 || d > 1 {
				t.Errorf("pixel %d = %v, want %v", tt.x, got, tt.want)
				break
			}
		}
	}
	// An opaque-by-type image (JPEG's YCbCr) is copied.
	ycc := image.NewYCbCr(image.Rect(0, 0, 4, 4), image.YCbCrSubsampleRatio420)
	for i := range ycc.Y {
		ycc.Y[i] = 0
	}
	for i := range ycc.Cb {
		ycc.Cb[i], ycc.Cr[i] = 128, 128
	}
	if got := rgbaAt(FlattenOn(ycc, White), 2, 2); got != [4]uint8{0, 0, 0, 255} {
		t.Errorf("YCbCr black flattened = %v", got)
	}
}

func TestResizeUniformStaysUniform(t *testing.T) {
	c := color.NRGBA{12, 200, 77, 255}
	src := solid(37, 23, c)
	interps := map[string]draw.Interpolator{
		"bilinear": draw.BiLinear, "catmullrom": draw.CatmullRom,
		"nearest": draw.NearestNeighbor, "approxbilinear": draw.ApproxBiLinear, "nil": nil,
	}
	for name, interp := range interps {
		for _, size := range [][2]int{{448, 448}, {5, 7}, {37, 23}, {1, 1}} {
			dst := Resize(src, size[0], size[1], interp)
			if dst.Rect != image.Rect(0, 0, size[0], size[1]) {
				t.Fatalf("%s: bounds %v", name, dst.Rect)
			}
			for i := 0; i < len(dst.Pix); i += 4 {
				if got := [4]uint8(dst.Pix[i : i+4]); got != [4]uint8{12, 200, 77, 255} {
					t.Fatalf("%s %v: pixel %d = %v", name, size, i/4, got)
				}
			}
		}
	}
}

func TestResizeDownsamplesAverages(t *testing.T) {
	// A 1-pixel checkerboard shrunk 8x with the triangle filter averages to grey, as
	// PIL's antialiased resize does (a plain bilinear tap would alias to black or white).
	src := image.NewGray(image.Rect(0, 0, 64, 64))
	for y := range 64 {
		for x := range 64 {
			if (x+y)%2 == 0 {
				src.Pix[y*64+x] = 255
			}
		}
	}
	dst := Resize(src, 8, 8, draw.BiLinear)
	for i := 0; i < len(dst.Pix); i += 4 {
		if v := dst.Pix[i]; v < 110 || v > 145 {
			t.Fatalf("pixel %d = %d, want about 128", i/4, v)
		}
	}
}

func TestPadSquare(t *testing.T) {
	red := color.NRGBA{255, 0, 0, 255}
	dst := PadSquare(solid(4, 2, red), White)
	if dst.Rect != image.Rect(0, 0, 4, 4) {
		t.Fatalf("bounds %v", dst.Rect)
	}
	for y := range 4 {
		want := [4]uint8{255, 255, 255, 255}
		if y == 1 || y == 2 {
			want = [4]uint8{255, 0, 0, 255}
		}
		for x := range 4 {
			if got := rgbaAt(dst, x, y); got != want {
				t.Fatalf("(%d,%d) = %v, want %v", x, y, got, want)
			}
		}
	}
	// Tall: padding left and right; already square: unchanged size.
	if dst := PadSquare(solid(3, 5, red), White); dst.Rect.Dx() != 5 || rgbaAt(dst, 0, 0)[1] != 255 || rgbaAt(dst, 2, 2)[1] != 0 {
		t.Errorf("tall pad wrong: %v", dst.Rect)
	}
	if dst := PadSquare(solid(6, 6, red), White); dst.Rect.Dx() != 6 || rgbaAt(dst, 0, 0) != [4]uint8{255, 0, 0, 255} {
		t.Errorf("square input changed")
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestLetterbox(t *testing.T) {
	red := color.NRGBA{255, 0, 0, 255}
	tests := []struct {
		name           string
		w, h, size     int
		upscale        bool
		scale          float64
		padX, padY     float64
		contentW, cntH int
	}{
		{"wide downscale", 800, 400, 400, false, 0.5, 0, 100, 400, 200},
		{"tall downscale", 300, 600, 200, true, 1.0 / 3, 50, 0, 100, 200},
		{"small, no upscale", 100, 50, 400, false, 1, 150, 175, 100, 50},
		{"small, upscale", 100, 50, 400, true, 4, 0, 100, 400, 200},
		{"exact", 448, 448, 448, false, 1, 0, 0, 448, 448},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst, li := Letterbox(solid(tt.w, tt.h, red), tt.size, LetterboxGray, tt.upscale)
			if dst.Rect != image.Rect(0, 0, tt.size, tt.size) {
				t.Fatalf("bounds %v", dst.Rect)
			}
			if !near(li.Scale, tt.scale) || li.PadX != tt.padX || li.PadY != tt.padY ||
				li.ContentW != tt.contentW || li.ContentH != tt.cntH || li.SrcW != tt.w || li.SrcH != tt.h {
				t.Fatalf("info %+v", li)
			}
			// The content is red, the padding grey, and PaddingMask agrees pixel by pixel.
			mask := make([]bool, tt.size*tt.size)
			li.PaddingMask(mask)
			for y := 0; y < tt.size; y += 7 {
				for x := 0; x < tt.size; x += 7 {
					want := [4]uint8{255, 0, 0, 255}
					if mask[y*tt.size+x] {
						want = [4]uint8{114, 114, 114, 255}
					}
					if got := rgbaAt(dst, x, y); got != want {
						t.Fatalf("(%d,%d) = %v, want %v (padding %v)", x, y, got, want, mask[y*tt.size+x])
					}
				}
			}
			padded := 0
			for _, p := range mask {
				if p {
					padded++
				}
			}
			if want := tt.size*tt.size - tt.contentW*tt.cntH; padded != want {
				t.Errorf("padding pixels = %d, want %d", padded, want)
			}
		})
	}
}

func TestLetterboxMapBox(t *testing.T) {
	// 800x400 into 400: scale 0.5, content 400x200 at y 100..300.
	_, li := Letterbox(solid(800, 400, color.Black), 400, LetterboxGray, false)
	tests := []struct {
		name string
		in   [4]float64
		want [4]float64
	}{
		{"inside", [4]float64{100, 150, 300, 250}, [4]float64{200, 100, 600, 300}},
		{"whole content", [4]float64{0, 100, 400, 300}, [4]float64{0, 0, 800, 400}},
		{"clamped", [4]float64{-10, 50, 500, 390}, [4]float64{0, 0, 800, 400}},
		{"in the top padding", [4]float64{10, 10, 20, 90}, [4]float64{20, 0, 40, 0}},
	}
	for _, tt := range tests {
		x1, y1, x2, y2 := li.MapBox(tt.in[0], tt.in[1], tt.in[2], tt.in[3])
		got := [4]float64{x1, y1, x2, y2}
		for i := range 4 {
			if !near(got[i], tt.want[i]) {
				t.Errorf("%s: MapBox%v = %v, want %v", tt.name, tt.in, got, tt.want)
				break
			}
		}
	}
	// Rounding of the content size: 333x100 into 100 gives 100x30 content; mapping the
	// content's corners must land on the image's corners exactly.
	_, li = Letterbox(solid(333, 100, color.Black), 100, LetterboxGray, false)
	x1, y1, x2, y2 := li.MapBox(li.PadX, li.PadY, li.PadX+float64(li.ContentW), li.PadY+float64(li.ContentH))
	if !near(x1, 0) || !near(y1, 0) || !near(x2, 333) || !near(y2, 100) {
		t.Errorf("content corners map to %v,%v,%v,%v, want 0,0,333,100 (info %+v)", x1, y1, x2, y2, li)
	}
}

// TestNoCopyWhenNothingToDo: what Load returns with alpha flattened (an opaque *image.RGBA
// at origin, already the model's size) passes FlattenOn and Resize as it is; a
// translucent one, one off origin or one of another size is composited or resampled
// into a new image, the input untouched.
func TestNoCopyWhenNothingToDo(t *testing.T) {
	opaque := image.NewRGBA(image.Rect(0, 0, 4, 3))
	for i := range opaque.Pix {
		opaque.Pix[i] = 255
	}
	if got := FlattenOn(opaque, color.White); got != opaque {
		t.Errorf("FlattenOn copied an opaque RGBA")
	}
	if got := Resize(opaque, 4, 3, nil); got != opaque {
		t.Errorf("Resize copied an RGBA already 4x3")
	}
	if got := Resize(opaque, 3, 3, nil); got == opaque || got.Rect != image.Rect(0, 0, 3, 3) {
		t.Errorf("Resize to 3x3 gave %v (same image: %v)", got.Rect, got == opaque)
	}
	clear := image.NewRGBA(image.Rect(0, 0, 2, 2)) // all transparent
	got := FlattenOn(clear, color.White)
	if got == clear || got.RGBAAt(1, 1) != (color.RGBA{255, 255, 255, 255}) || clear.Pix[0] != 0 {
		t.Errorf("FlattenOn of a transparent RGBA: same image %v, pixel %v, input changed %v", got == clear, got.RGBAAt(1, 1), clear.Pix[0] != 0)
	}
	off := opaque.SubImage(image.Rect(1, 1, 3, 3)).(*image.RGBA)
	if got := FlattenOn(off, color.White); got == off || got.Rect.Min != (image.Point{}) {
		t.Errorf("FlattenOn of an image off origin kept it there: %v", got.Rect)
	}
}
