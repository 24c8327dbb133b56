package images

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/color/palette"
	"image/gif"
	"image/jpeg"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/image/bmp"

	"github.com/ortbus/ortbus/codec"
)

// tinyWebP is a complete lossless WebP (RIFF/WEBP with one VP8L chunk, 34 bytes) of a
// 2x1 image: pixel (0,0) opaque red, pixel (1,0) opaque blue. x/image has no WebP encoder,
// so it was assembled by hand from the VP8L spec (bits are read LSB first):
//
//	RIFF, size 26, WEBP, VP8L, size 13, then the 13-byte bitstream:
//	0x2f signature; width-1 = 1 (14 bits); height-1 = 0 (14 bits); alpha hint 0;
//	version 0; no transform; no colour cache; no meta prefix codes; five "simple" prefix
//	codes: green {0}, red {255 -> code 0, 0 -> code 1}, blue {0 -> code 0, 255 -> code 1},
//	alpha {255}, distance {0}; then per pixel the red and blue codes: 0,0 then 1,1.
//
// TestDecodeFormats checks that it decodes to exactly those two pixels.
var tinyWebP = []byte{
	0x52, 0x49, 0x46, 0x46, 0x1a, 0x00, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50,
	0x56, 0x50, 0x38, 0x4c, 0x0d, 0x00, 0x00, 0x00, 0x2f, 0x01, 0x00, 0x00,
	0x00, 0x88, 0xff, 0x03, 0x1c, 0xe0, 0xbf, 0xff, 0xc1, 0x00,
}

func TestOpenErrors(t *testing.T) {
	f := newFixture(t)
	pol := f.policy()
	tests := []struct {
		name    string
		path    string
		code    codec.Code
		message string // a substring the message must contain
	}{
		{"relative", "img/a.png", codec.CodeBadRequest, "not absolute"},
		{"root/../etc/passwd", "/root/../etc/passwd", codec.CodeBadRequest, "not clean"},
		{"dotdot escape", f.root + "/../outside/secret.png", codec.CodeBadRequest, "not clean"},
		{"outside", f.p("outside/secret.png"), codec.CodeForbiddenPath, "outside the allowed roots"},
		{"outside missing", f.p("outside/nope.png"), codec.CodeForbiddenPath, ""},
		{"prefix sibling", f.p("img2/a.png"), codec.CodeForbiddenPath, ""},
		{"symlink out", f.p("img/link_out.png"), codec.CodeForbiddenPath, ""},
		{"dangling symlink out", f.p("img/dangling_out.png"), codec.CodeForbiddenPath, ""},
		{"missing", f.p("img/nope.png"), codec.CodeFileNotFound, "not found"},
		{"name over NAME_MAX", f.p("img/" + strings.Repeat("n", 300) + ".png"), codec.CodeBadRequest, "longer than the filesystem allows"},
		{"dangling symlink in", f.p("img/dangling_in.png"), codec.CodeFileNotFound, ""},
		{"directory", f.p("img/sub"), codec.CodeUnsupportedImage, "is a directory"},
		{"root directory", f.root, codec.CodeUnsupportedImage, "is a directory"},
		{"fifo", f.p("img/fifo"), codec.CodeUnsupportedImage, "not a regular file"},
		{"text named .png", f.p("img/text.png"), codec.CodeUnsupportedImage, "unknown format"},
		{"truncated png", f.p("img/trunc.png"), codec.CodeUnsupportedImage, "unexpected EOF"},
		{"huge header", f.p("img/huge.png"), codec.CodeImageTooLarge, "100000x100000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done := make(chan struct{})
			var (
				img image.Image
				err error
			)
			go func() { // a FIFO opened without O_NONBLOCK would hang here
				defer close(done)
				img, _, err = pol.Open(tt.path)
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("Open(%q) hung", tt.path)
			}
			if c := codeOf(t, err); c != tt.code {
				t.Fatalf("Open(%q) code %q (%v), want %q", tt.path, c, err, tt.code)
			}
			if img != nil {
				t.Errorf("Open returned an image with an error")
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Errorf("message %q lacks %q", err.Error(), tt.message)
			}
			var ce *codec.Error
			errors.As(err, &ce)
			if tt.path != "" && ce.Details["path"] != tt.path {
				t.Errorf("details.path = %v, want %q", ce.Details["path"], tt.path)
			}
		})
	}
}

// TestOpenTooLargeReadsHeaderOnly: the IHDR declares 10^10 pixels and there is no pixel
// data, so image_too_large (not unsupported_image) proves the limit is checked before
// decoding, and the memory allocated proves nothing pixel-sized was allocated.
func TestOpenTooLargeReadsHeaderOnly(t *testing.T) {
	f := newFixture(t)
	pol := Policy{AllowedRoots: []string{f.root}, MaxPixels: 1 << 20}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, _, err := pol.Open(f.p("img/huge.png"))
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	var ce *codec.Error
	if !errors.As(err, &ce) || ce.Code != codec.CodeImageTooLarge {
		t.Fatalf("Open(huge) = %v, want image_too_large", err)
	}
	for k, want := range map[string]any{"width": 100000, "height": 100000, "max_pixels": int64(1 << 20)} {
		if ce.Details[k] != want {
			t.Errorf("details[%s] = %v (%T), want %v", k, ce.Details[k], ce.Details[k], want)
		}
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("Open(huge) allocated %d bytes; it should only read the header", alloc)
	}
	if elapsed > time.Second {
		t.Errorf("Open(huge) took %v", elapsed)
	}
	// The default limit refuses it too.
	if _, _, err := f.policy().Open(f.p("img/huge.png")); codeOf(t, err) != codec.CodeImageTooLarge {
		t.Errorf("default MaxPixels: %v", err)
	}
}

func TestOpenPixelLimitBoundary(t *testing.T) {
	f := newFixture(t) // img/a.png is 8x6 = 48 pixels
	for _, tt := range []struct {
		max  int64
		code codec.Code
	}{{48, ""}, {49, ""}, {47, codec.CodeImageTooLarge}} {
		pol := Policy{AllowedRoots: []string{f.root}, MaxPixels: tt.max}
		if _, _, err := pol.Open(f.p("img/a.png")); codeOf(t, err) != tt.code {
			t.Errorf("MaxPixels %d: %v, want %q", tt.max, err, tt.code)
		}
	}
}

func TestOpenValid(t *testing.T) {
	f := newFixture(t)
	for _, path := range []string{f.p("img/a.png"), f.p("img/link_in.png")} {
		img, info, err := f.policy().Open(path)
		if err != nil {
			t.Fatalf("Open(%q): %v", path, err)
		}
		want := Info{Path: f.p("img/a.png"), Format: "png", Width: 8, Height: 6}
		if info != want {
			t.Errorf("Info = %+v, want %+v", info, want)
		}
		if img.Bounds() != image.Rect(0, 0, 8, 6) {
			t.Errorf("bounds %v", img.Bounds())
		}
		if r, g, b, _ := img.At(3, 3).RGBA(); r>>8 != 200 || g>>8 != 100 || b>>8 != 50 {
			t.Errorf("pixel = %d,%d,%d", r>>8, g>>8, b>>8)
		}
	}
}

// TestDecodeFormats opens one file of each accepted format and checks its pixels.
func TestDecodeFormats(t *testing.T) {
	f := newFixture(t)
	// Left half red, right half blue: 8x6.
	src := image.NewNRGBA(image.Rect(0, 0, 8, 6))
	for y := range 6 {
		for x := range 8 {
			c := color.NRGBA{255, 0, 0, 255}
			if x >= 4 {
				c = color.NRGBA{0, 0, 255, 255}
			}
			src.Set(x, y, c)
		}
	}
	encode := func(enc func(*bytes.Buffer) error) []byte {
		var buf bytes.Buffer
		if err := enc(&buf); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	files := map[string][]byte{
		"png":  encodePNG(t, src),
		"jpeg": encode(func(b *bytes.Buffer) error { return jpeg.Encode(b, src, &jpeg.Options{Quality: 100}) }),
		"gif":  encode(func(b *bytes.Buffer) error { return gif.Encode(b, src, nil) }),
		"bmp":  encode(func(b *bytes.Buffer) error { return bmp.Encode(b, src) }),
		"webp": tinyWebP,
	}
	for format, data := range files {
		t.Run(format, func(t *testing.T) {
			// Deliberately misnamed: the format comes from the content, not the name.
			path := f.p("img/image-" + format + ".bin")
			writeFile(t, path, data)
			img, info, err := f.policy().Open(path)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			w, h := 8, 6
			if format == "webp" {
				w, h = 2, 1
			}
			if info.Format != format || info.Width != w || info.Height != h {
				t.Fatalf("Info = %+v, want %s %dx%d", info, format, w, h)
			}
			if img.Bounds() != image.Rect(0, 0, w, h) {
				t.Fatalf("bounds = %v", img.Bounds())
			}
			tol := 0
			if format == "jpeg" {
				tol = 40 // lossy, and chroma is subsampled at the red/blue edge
			}
			checkRGB(t, img, 0, 0, [3]int{255, 0, 0}, tol)
			checkRGB(t, img, w-1, h-1, [3]int{0, 0, 255}, tol)
		})
	}
}

// TestDecodeGIFFirstFrameOnCanvas: a GIF whose first frame covers part of the logical
// screen gives a screen-sized image, transparent outside the frame.
func TestDecodeGIFFirstFrameOnCanvas(t *testing.T) {
	frame := image.NewPaletted(image.Rect(2, 1, 5, 4), palette.Plan9)
	for i := range frame.Pix {
		frame.Pix[i] = uint8(frame.Palette.Index(color.RGBA{0, 255, 0, 255}))
	}
	second := image.NewPaletted(image.Rect(0, 0, 8, 6), palette.Plan9) // all index 0 (black)
	var buf bytes.Buffer
	g := &gif.GIF{
		Image:  []*image.Paletted{frame, second},
		Delay:  []int{0, 0},
		Config: image.Config{ColorModel: frame.Palette, Width: 8, Height: 6},
	}
	if err := gif.EncodeAll(&buf, g); err != nil {
		t.Fatal(err)
	}
	img, info, err := Decode(bytes.NewReader(buf.Bytes()), 0)
	if err != nil {
		t.Fatal(err)
	}
	if info.Width != 8 || info.Height != 6 || img.Bounds() != image.Rect(0, 0, 8, 6) {
		t.Fatalf("info %+v bounds %v", info, img.Bounds())
	}
	checkRGB(t, img, 3, 2, [3]int{0, 255, 0}, 0)
	if _, _, _, a := img.At(0, 0).RGBA(); a != 0 {
		t.Errorf("outside the first frame alpha = %d, want 0", a)
	}
}

func TestDecodeRefusesOtherFormats(t *testing.T) {
	// Registered elsewhere in a binary, a format must still be refused.
	image.RegisterFormat("ortbus-test", "ORTBUSTEST", func(r io.Reader) (image.Image, error) {
		return image.NewRGBA(image.Rect(0, 0, 1, 1)), nil
	}, func(r io.Reader) (image.Config, error) {
		return image.Config{ColorModel: color.RGBAModel, Width: 1, Height: 1}, nil
	})
	_, _, err := Decode(bytes.NewReader([]byte("ORTBUSTEST")), 0)
	if codeOf(t, err) != codec.CodeUnsupportedImage {
		t.Fatalf("custom format: %v", err)
	}
}

func checkRGB(t *testing.T, img image.Image, x, y int, want [3]int, tol int) {
	t.Helper()
	r, g, b, _ := img.At(x, y).RGBA()
	got := [3]int{int(r >> 8), int(g >> 8), int(b >> 8)}
	for i := range 3 {
		if d := got[i] - want[i]; d > tol || d < -tol {
			t.Errorf("pixel (%d,%d) = %v, want %v ±%d", x, y, got, want, tol)
			return
		}
	}
}

// TestReadBoundedIntoReuses: a buffer large enough is read into, not replaced; one too
// small is not written past (a new one is made); the limit holds either way.
func TestReadBoundedIntoReuses(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 1000)
	big := make([]byte, 5, 4096)
	got, err := readBoundedInto(big, bytes.NewReader(data), int64(len(data)), 1<<20, "f", kindImage)
	if err != nil || !bytes.Equal(got, data) || &got[0] != &big[:1][0] {
		t.Fatalf("into a 4096-byte buffer: err %v, equal %v, same memory %v", err, bytes.Equal(got, data), err == nil && &got[0] == &big[:1][0])
	}
	small := make([]byte, 0, 10)
	got, err = readBoundedInto(small, bytes.NewReader(data), int64(len(data)), 1<<20, "f", kindImage)
	if err != nil || !bytes.Equal(got, data) || &got[0] == &small[:1][0] {
		t.Fatalf("into a 10-byte buffer: err %v, equal %v", err, bytes.Equal(got, data))
	}
	if _, err := readBoundedInto(big, bytes.NewReader(data), 0, 999, "f", kindImage); codec.AsError(err).Code != codec.CodeImageTooLarge {
		t.Fatalf("over the limit into a pooled buffer: %v", err)
	}
}
