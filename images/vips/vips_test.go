package vips_test

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/images/vips"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

func lib(t testing.TB) *vips.Lib { return testenv.RequireVips(t) }

// gradient returns w×h RGB pixels: red rises left to right, green top to bottom.
func gradient(w, h int) []byte {
	pix := make([]byte, 0, w*h*3)
	for y := range h {
		for x := range w {
			pix = append(pix, byte(x*255/max(1, w-1)), byte(y*255/max(1, h-1)), 80)
		}
	}
	return pix
}

func TestVersionAndLoaders(t *testing.T) {
	l := lib(t)
	if l.Version == "" || l.Threads != 1 {
		t.Fatalf("lib = %+v", l)
	}
	for _, op := range []string{"jpegload_buffer", "pngload_buffer", "webpload_buffer"} {
		if !l.HasLoader(op) {
			t.Errorf("no %s", op)
		}
	}
	if l.HasLoader("nosuchload_buffer") {
		t.Errorf("a loader that does not exist was found")
	}
}

func TestHeaderAndDecode(t *testing.T) {
	l := lib(t)
	data, err := l.Encode(gradient(300, 200), 300, 200, 3, ".jpg[Q=95]", "", 6)
	if err != nil {
		t.Fatal(err)
	}
	h, err := l.Header(data)
	if err != nil {
		t.Fatal(err)
	}
	if h.Format != "jpeg" || h.Width != 300 || h.Height != 200 || h.Orientation != 6 {
		t.Fatalf("header = %+v", h)
	}
	if w, ht := h.Upright(); w != 200 || ht != 300 {
		t.Fatalf("upright = %dx%d", w, ht)
	}
	full, _, err := l.Load(data, 1<<30, vips.Spec{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if full.Width != 200 || full.Height != 300 || full.Bands != 3 {
		t.Fatalf("full = %dx%dx%d", full.Width, full.Height, full.Bands)
	}
	th, err := l.Decode(data, vips.Spec{Width: 64, Height: 64, Size: vips.Force})
	if err != nil {
		t.Fatal(err)
	}
	if th.Width != 64 || th.Height != 64 || len(th.Pix) != 64*64*3 {
		t.Fatalf("thumb = %dx%dx%d", th.Width, th.Height, th.Bands)
	}
	if _, _, err := l.Load(data, 300*200-1, vips.Spec{}, nil); codec.CodeOf(err) != codec.CodeImageTooLarge {
		t.Fatalf("over the pixel limit: %v", err)
	}
}

func TestAlpha(t *testing.T) {
	l := lib(t)
	img := image.NewNRGBA(image.Rect(0, 0, 8, 8))
	for i := range 64 {
		img.Set(i%8, i/8, color.NRGBA{10, 20, 30, 0}) // fully transparent
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	flat, err := l.Decode(buf.Bytes(), vips.Spec{Background: [3]uint8{255, 255, 255}})
	if err != nil {
		t.Fatal(err)
	}
	if flat.Bands != 3 || flat.Pix[0] != 255 || flat.Pix[1] != 255 || flat.Pix[2] != 255 {
		t.Fatalf("flattened = %d bands, %v", flat.Bands, flat.Pix[:3])
	}
	kept, err := l.Decode(buf.Bytes(), vips.Spec{KeepAlpha: true})
	if err != nil {
		t.Fatal(err)
	}
	if kept.Bands != 4 || kept.Pix[3] != 0 {
		t.Fatalf("kept = %d bands, %v", kept.Bands, kept.Pix[:4])
	}
}

func TestGarbage(t *testing.T) {
	l := lib(t)
	for _, data := range [][]byte{nil, []byte("hello"), bytes.Repeat([]byte{0xff}, 100)} {
		if _, _, err := l.Load(data, 1<<30, vips.Spec{}, nil); codec.CodeOf(err) != codec.CodeUnsupportedImage {
			t.Errorf("%q: %v", data, err)
		}
	}
}

// TestConcurrentDecodes: libvips serves decodes from many goroutines at once (each cgo
// call on its own thread), each with its own answer.
func TestConcurrentDecodes(t *testing.T) {
	l := lib(t)
	sizes := []int{40, 64, 96, 128}
	data := make([][]byte, len(sizes))
	for i, s := range sizes {
		b, err := l.Encode(gradient(s, s/2), s, s/2, 3, ".png", "", 0)
		if err != nil {
			t.Fatal(err)
		}
		data[i] = b
	}
	errs := make(chan error, 32)
	for g := range 32 {
		go func() {
			i := g % len(sizes)
			img, _, err := l.Load(data[i], 1<<20, vips.Spec{Width: sizes[i] / 2, Height: sizes[i] / 2, Size: vips.Fit}, nil)
			if err == nil && (img.Width != sizes[i]/2 || img.Height != sizes[i]/4) {
				err = fmt.Errorf("decode %d gave %dx%d", i, img.Width, img.Height)
			}
			errs <- err
		}()
	}
	for range 32 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestWarmUp: every format of the warm list that this libvips writes is decoded once (the
// npm build writes all of them), and the heap is faulted in without error when tuned.
func TestWarmUp(t *testing.T) {
	l := lib(t)
	n, took := l.WarmUp()
	if n != 8 {
		t.Errorf("%d formats warmed, want 8 (jpeg, progressive jpeg, png, 16-bit png, webp, avif, tiff, gif)", n)
	}
	t.Logf("warm-up took %v", took)
}
