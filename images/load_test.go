package images

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/image/bmp"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/images/vips"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// picture is w×h RGB bytes with structure in both axes (a gradient, a dark disc, a bright
// bar near the top-left), so a rotation or a flip shows.
func picture(w, h int) []byte {
	pix := make([]byte, 0, w*h*3)
	cx, cy, r := float64(w)*0.6, float64(h)*0.6, float64(min(w, h))/4
	for y := range h {
		for x := range w {
			p := [3]byte{byte(x * 255 / max(1, w-1)), byte(y * 255 / max(1, h-1)), 90}
			if math.Hypot(float64(x)-cx, float64(y)-cy) < r {
				p = [3]byte{20, 30, 160}
			}
			if y < h/8 && x < w/3 {
				p = [3]byte{250, 240, 20}
			}
			pix = append(pix, p[:]...)
		}
	}
	return pix
}

// rgbaOf adds an alpha byte to every pixel of rgb.
func rgbaOf(rgb []byte, alpha func(i int) byte) []byte {
	out := make([]byte, 0, len(rgb)/3*4)
	for i := 0; i < len(rgb); i += 3 {
		out = append(out, rgb[i], rgb[i+1], rgb[i+2], alpha(i/3))
	}
	return out
}

// rgbOf is img's RGB bytes, row by row.
func rgbOf(img image.Image) []byte {
	b := img.Bounds()
	out := make([]byte, 0, 3*b.Dx()*b.Dy())
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.NRGBAModel.Convert(img.At(x, y)).(color.NRGBA)
			out = append(out, c.R, c.G, c.B)
		}
	}
	return out
}

// meanDiff is the mean absolute difference of img's RGB from want (w×h RGB bytes).
func meanDiff(t *testing.T, img image.Image, want []byte, w, h int) float64 {
	t.Helper()
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Fatalf("image is %v, want %dx%d", b, w, h)
	}
	var sum float64
	for y := range h {
		for x := range w {
			c := color.NRGBAModel.Convert(img.At(x, y)).(color.NRGBA)
			o := 3 * (y*w + x)
			sum += math.Abs(float64(c.R)-float64(want[o])) + math.Abs(float64(c.G)-float64(want[o+1])) + math.Abs(float64(c.B)-float64(want[o+2]))
		}
	}
	return sum / float64(3*w*h)
}

type formatCase struct {
	name, format string
	data         []byte
	tol          float64 // mean absolute difference allowed from the source, per sample
}

// formatCases encodes pic (w×h RGB) in every format the issue lists that this libvips
// writes, and BMP with Go's encoder.
func formatCases(t *testing.T, l *vips.Lib, pic []byte, w, h int) []formatCase {
	t.Helper()
	enc := func(pix []byte, bands int, suffix, to string) []byte {
		t.Helper()
		b, err := l.Encode(pix, w, h, bands, suffix, to, 0)
		if err != nil {
			t.Fatalf("encode %s %s: %v", suffix, to, err)
		}
		return b
	}
	opaque := rgbaOf(pic, func(int) byte { return 255 })
	var bmpBuf bytes.Buffer
	if err := bmp.Encode(&bmpBuf, &image.NRGBA{Pix: opaque, Stride: 4 * w, Rect: image.Rect(0, 0, w, h)}); err != nil {
		t.Fatal(err)
	}
	cases := []formatCase{
		{"jpeg baseline", "jpeg", enc(pic, 3, ".jpg[Q=92]", ""), 6},
		{"jpeg progressive", "jpeg", enc(pic, 3, ".jpg[Q=92,interlace]", ""), 6},
		{"jpeg cmyk", "jpeg", enc(pic, 3, ".jpg[Q=92]", "cmyk"), 25},
		{"jpeg gray", "jpeg", enc(pic, 3, ".jpg[Q=92]", "b-w"), 60},
		{"png 8-bit", "png", enc(pic, 3, ".png", ""), 0.01},
		{"png 16-bit", "png", enc(pic, 3, ".png", "rgb16"), 1},
		{"png palette", "png", enc(pic, 3, ".png[palette]", ""), 8},
		{"png alpha", "png", enc(opaque, 4, ".png", ""), 0.01},
		{"png 16-bit alpha", "png", enc(opaque, 4, ".png", "rgb16"), 1},
		{"tiff 16-bit", "tiff", enc(pic, 3, ".tif", "rgb16"), 1},
		{"tiff cmyk", "tiff", enc(pic, 3, ".tif", "cmyk"), 25},
		{"webp", "webp", enc(pic, 3, ".webp[Q=90]", ""), 8},
		{"tiff", "tiff", enc(pic, 3, ".tif", ""), 0.01},
		{"gif", "gif", enc(pic, 3, ".gif", ""), 12},
		{"bmp", "bmp", bmpBuf.Bytes(), 0.01},
	}
	if l.HasLoader("heifload_buffer") {
		if b, err := l.Encode(pic, w, h, 3, ".avif[Q=80]", "", 0); err == nil {
			cases = append(cases, formatCase{"avif", "heif", b, 12})
		} else {
			t.Logf("no AVIF encoder: %v", err)
		}
	}
	return cases
}

// TestLoadFormats loads every format whole and straight to a box: the upright size, the
// format's name, pixels near the source's, and the header's pixel bound (MaxPixels one
// below the image's) refusing each before any decode.
func TestLoadFormats(t *testing.T) {
	l := testenv.RequireVips(t)
	const w, h = 160, 120
	pic := picture(w, h)
	for _, c := range formatCases(t, l, pic, w, h) {
		t.Run(c.name, func(t *testing.T) {
			img, info, err := LoadBytes(c.data, 0, LoadSpec{Background: WhiteRGBA})
			if err != nil {
				t.Fatal(err)
			}
			if info.Format != c.format || info.Width != w || info.Height != h {
				t.Fatalf("info = %+v, want %s %dx%d", info, c.format, w, h)
			}
			if d := meanDiff(t, img, pic, w, h); d > c.tol {
				t.Errorf("mean difference from the source %.3f, over %.3f", d, c.tol)
			}
			box, info2, err := LoadBytes(c.data, 0, LoadSpec{Width: 64, Height: 64, Fill: FillForce, Background: WhiteRGBA})
			if err != nil {
				t.Fatal(err)
			}
			// BMP comes whole (Go decodes it); the callers resize.
			if b := box.Bounds(); (b.Dx() != 64 || b.Dy() != 64) && c.format != "bmp" {
				t.Errorf("box load is %v, want 64x64", b)
			}
			if info2.Width != w || info2.Height != h {
				t.Errorf("box load info = %+v, want the whole image's size", info2)
			}
			_, _, err = LoadBytes(c.data, w*h-1, LoadSpec{})
			if codec.CodeOf(err) != codec.CodeImageTooLarge {
				t.Errorf("one pixel over the limit: %v, want image_too_large", err)
			}
		})
	}
}

// TestLoadFirstFrame: an animated GIF or WebP and a multi-page TIFF give their first frame,
// and their size is the frame's.
func TestLoadFirstFrame(t *testing.T) {
	l := testenv.RequireVips(t)
	const w, h = 32, 24
	frames := make([]byte, 0, 3*w*h*3)
	for _, c := range [][3]byte{{230, 20, 20}, {20, 20, 230}, {20, 230, 20}} {
		for range w * h {
			frames = append(frames, c[:]...)
		}
	}
	for _, suffix := range []string{".gif", ".webp", ".tif"} {
		data, err := l.EncodePages(frames, w, 3*h, 3, h, suffix, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		img, info, err := LoadBytes(data, 0, LoadSpec{})
		if err != nil {
			t.Fatalf("%s: %v", suffix, err)
		}
		if info.Width != w || info.Height != h || img.Bounds() != image.Rect(0, 0, w, h) {
			t.Fatalf("%s: info %+v, bounds %v, want the first frame's %dx%d", suffix, info, img.Bounds(), w, h)
		}
		if c := color.NRGBAModel.Convert(img.At(w/2, h/2)).(color.NRGBA); c.R < 200 || c.B > 60 {
			t.Errorf("%s: first frame's centre is %v, want red", suffix, c)
		}
	}
}

// TestLoadAlpha: transparent pixels flatten onto the background asked for, or stay
// transparent with KeepAlpha.
func TestLoadAlpha(t *testing.T) {
	l := testenv.RequireVips(t)
	const w, h = 32, 16
	pic := picture(w, h)
	data, err := l.Encode(rgbaOf(pic, func(i int) byte {
		if i%w < w/2 {
			return 0
		}
		return 255
	}), w, h, 4, ".png", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	img, _, err := LoadBytes(data, 0, LoadSpec{Background: color.RGBA{1, 2, 3, 255}})
	if err != nil {
		t.Fatal(err)
	}
	if c := img.At(0, 0).(color.RGBA); c != (color.RGBA{1, 2, 3, 255}) {
		t.Errorf("transparent pixel flattened to %v", c)
	}
	if c := img.At(w-1, h-1).(color.RGBA); c.R != pic[len(pic)-3] || c.A != 255 {
		t.Errorf("opaque pixel became %v", c)
	}
	kept, _, err := LoadBytes(data, 0, LoadSpec{KeepAlpha: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := kept.At(0, 0).(color.NRGBA); c.A != 0 {
		t.Errorf("KeepAlpha: transparent pixel has alpha %d", c.A)
	}
	if c := kept.At(w-1, 0).(color.NRGBA); c.A != 255 {
		t.Errorf("KeepAlpha: opaque pixel has alpha %d", c.A)
	}
}

// rotateCW turns w×h RGB pixels a quarter turn clockwise (what EXIF orientation 6 asks a
// viewer to do): the result is h×w.
func rotateCW(pix []byte, w, h int) []byte {
	out := make([]byte, len(pix))
	for y := range w { // rows of the result
		for x := range h {
			s := 3 * ((h-1-x)*w + y)
			d := 3 * (y*h + x)
			copy(out[d:d+3], pix[s:s+3])
		}
	}
	return out
}

// TestLoadRotated: a photo stored sideways with EXIF orientation 6 loads as its upright
// copy, whole and straight to a box, through the path policy.
func TestLoadRotated(t *testing.T) {
	l := testenv.RequireVips(t)
	const w, h = 300, 200
	pic := picture(w, h)
	sideways, err := l.Encode(pic, w, h, 3, ".jpg[Q=95]", "", 6)
	if err != nil {
		t.Fatal(err)
	}
	up := rotateCW(pic, w, h)
	upright, err := l.Encode(up, h, w, 3, ".jpg[Q=95]", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for name, b := range map[string][]byte{"sideways.jpg": sideways, "upright.jpg": upright} {
		if err := os.WriteFile(filepath.Join(root, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pol := Policy{AllowedRoots: []string{root}}
	img, info, err := pol.Load(filepath.Join(root, "sideways.jpg"), LoadSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Width != h || info.Height != w {
		t.Fatalf("info = %+v, want the upright %dx%d", info, h, w)
	}
	if d := meanDiff(t, img, up, h, w); d > 6 {
		t.Errorf("sideways photo differs from its upright copy by %.2f per sample", d)
	}
	// Straight to a box: the same as the upright copy's.
	spec := LoadSpec{Width: 50, Height: 50, Fill: FillFit}
	a, _, err := pol.Load(filepath.Join(root, "sideways.jpg"), spec)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := pol.Load(filepath.Join(root, "upright.jpg"), spec)
	if err != nil {
		t.Fatal(err)
	}
	if a.Bounds() != b.Bounds() || a.Bounds().Dy() != 50 {
		t.Fatalf("boxes %v and %v", a.Bounds(), b.Bounds())
	}
	bb := b.(*image.RGBA)
	ref := make([]byte, 0, 3*len(bb.Pix)/4)
	for i := 0; i < len(bb.Pix); i += 4 {
		ref = append(ref, bb.Pix[i:i+3]...)
	}
	if d := meanDiff(t, a, ref, a.Bounds().Dx(), 50); d > 6 {
		t.Errorf("sideways box differs from the upright one by %.2f per sample", d)
	}
	// The reference Go path ignores the orientation: sideways.
	if _, info, err := pol.Open(filepath.Join(root, "sideways.jpg")); err != nil || info.Width != w {
		t.Errorf("Open: %+v, %v", info, err)
	}
}

// TestLoadHostile: truncated files of every format, decompression bombs whose headers
// declare huge sizes, and huge ICC/EXIF blocks are refused with the contract's codes (or,
// for the metadata, loaded), quickly, and never crash the process.
func TestLoadHostile(t *testing.T) {
	l := testenv.RequireVips(t)
	const w, h = 160, 120
	pic := picture(w, h)
	for _, c := range formatCases(t, l, pic, w, h) {
		for _, cut := range []int{0, 8, 40, len(c.data) / 3, len(c.data) / 2, len(c.data) - 10} {
			if cut < 0 || cut >= len(c.data) {
				continue
			}
			for _, spec := range []LoadSpec{{Width: 64, Height: 64, Fill: FillForce}, {}} {
				img, _, err := LoadBytes(c.data[:cut], 0, spec)
				if err == nil && cut > len(c.data)/4 {
					// Only what follows the pixels is gone (a PNG's IEND, the end of an
					// AVIF's box, a TIFF's embedded ICC profile): then every pixel is
					// there, as in the whole file.
					whole, _, werr := LoadBytes(c.data, 0, spec)
					if werr != nil || !bytes.Equal(rgbOf(img), rgbOf(whole)) {
						t.Errorf("%s cut at %d of %d bytes (%+v) loaded other pixels than the whole file", c.name, cut, len(c.data), spec)
					}
					continue
				}
				if codec.CodeOf(err) != codec.CodeUnsupportedImage {
					t.Errorf("%s cut at %d of %d bytes (%+v): %v, want unsupported_image", c.name, cut, len(c.data), spec, err)
				}
			}
		}
	}

	jpg, err := l.Encode(pic, w, h, 3, ".jpg[Q=90]", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	// A JPEG big enough for DCT scaling on load (640x480 to 64: 1/8), cut.
	big, err := l.Encode(picture(640, 480), 640, 480, 3, ".jpg[Q=90]", "", 6)
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{len(big) / 3, len(big) / 2} {
		for _, fill := range []Fill{FillForce, FillFit, FillFitDown} {
			if _, _, err := LoadBytes(big[:cut], 0, LoadSpec{Width: 64, Height: 64, Fill: fill}); codec.CodeOf(err) != codec.CodeUnsupportedImage {
				t.Errorf("640x480 JPEG cut at %d of %d bytes to 64 (fill %d): %v, want unsupported_image", cut, len(big), fill, err)
			}
		}
	}
	if img, info, err := LoadBytes(big, 0, LoadSpec{Width: 64, Height: 64, Fill: FillFit}); err != nil || img.Bounds() != image.Rect(0, 0, 48, 64) || info.Width != 480 {
		t.Errorf("640x480 JPEG, orientation 6, fitted to 64: %v, %+v, %v; want 48x64 upright", img.Bounds(), info, err)
	}
	gif, err := l.Encode(pic, w, h, 3, ".gif", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	bombs := map[string][]byte{
		"png 100000x100000": pngBomb(t, 100000, 100000),
		"png header only":   pngHeaderOnly(100000, 100000),
		"jpeg 65500x65500":  jpegSized(t, jpg, 65500, 65500),
		"gif 65535x65535":   gifSized(t, gif, 65535, 65535),
	}
	for name, data := range bombs {
		start := time.Now()
		_, _, err := LoadBytes(data, 0, LoadSpec{Width: 64, Height: 64, Fill: FillForce})
		code := codec.CodeOf(err)
		if code != codec.CodeImageTooLarge && code != codec.CodeUnsupportedImage {
			t.Errorf("%s: %v, want image_too_large or unsupported_image", name, err)
		}
		if code != codec.CodeImageTooLarge {
			t.Errorf("%s: %v, want image_too_large from the header", name, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s took %v: it should be refused from its header", name, d)
		}
	}

	// A JPEG carrying 8 MB of garbage ICC profile chunks and a 64 KB garbage EXIF block:
	// loaded (the metadata ignored) or unsupported_image, never anything else.
	for name, seg := range map[string][]byte{
		"huge icc":  bytes.Repeat(app(0xe2, append([]byte("ICC_PROFILE\x00\x01\x80"), bytes.Repeat([]byte{0xa5}, 65000)...)), 128),
		"huge exif": app(0xe1, append([]byte("Exif\x00\x00II*\x00\x08\x00\x00\x00\xff\xff"), bytes.Repeat([]byte{0x5a}, 65000)...)),
	} {
		data := append(append(append([]byte{}, jpg[:2]...), seg...), jpg[2:]...)
		img, _, err := LoadBytes(data, 0, LoadSpec{Width: 64, Height: 64, Fill: FillForce})
		if err != nil && codec.CodeOf(err) != codec.CodeUnsupportedImage {
			t.Errorf("%s: %v", name, err)
		}
		if err == nil && img.Bounds().Dx() != 64 {
			t.Errorf("%s: %v", name, img.Bounds())
		}
	}

	// Formats libvips knows but Load does not accept.
	svg := []byte(`<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>`)
	if _, _, err := LoadBytes(svg, 0, LoadSpec{}); codec.CodeOf(err) != codec.CodeUnsupportedImage {
		t.Errorf("svg: %v, want unsupported_image", err)
	}
}

// app is a JPEG APPn segment (n = marker&0xf) holding body (at most 65533 bytes).
func app(marker byte, body []byte) []byte {
	out := []byte{0xff, marker}
	out = binary.BigEndian.AppendUint16(out, uint16(len(body)+2))
	return append(out, body...)
}

// jpegSized rewrites the frame header (SOF0/SOF2) of a JPEG to declare w×h.
func jpegSized(t *testing.T, jpg []byte, w, h uint16) []byte {
	t.Helper()
	out := append([]byte{}, jpg...)
	for i := 2; i+9 < len(out); {
		if out[i] != 0xff {
			t.Fatal("jpegSized: lost the segment chain")
		}
		m := out[i+1]
		n := int(binary.BigEndian.Uint16(out[i+2:]))
		if m == 0xc0 || m == 0xc2 {
			binary.BigEndian.PutUint16(out[i+5:], h)
			binary.BigEndian.PutUint16(out[i+7:], w)
			return out
		}
		i += 2 + n
	}
	t.Fatal("jpegSized: no frame header")
	return nil
}

// gifSized rewrites a GIF's logical screen size and its first frame's.
func gifSized(t testing.TB, gif []byte, w, h uint16) []byte {
	t.Helper()
	out := append([]byte{}, gif...)
	binary.LittleEndian.PutUint16(out[6:], w)
	binary.LittleEndian.PutUint16(out[8:], h)
	i := 13
	if out[10]&0x80 != 0 {
		i += 3 << (out[10]&7 + 1)
	}
	for i < len(out) {
		switch out[i] {
		case 0x21: // extension: label, then sub-blocks to a zero length
			i += 2
			for i < len(out) && out[i] != 0 {
				i += int(out[i]) + 1
			}
			i++
		case 0x2c: // image descriptor: left, top, width, height
			binary.LittleEndian.PutUint16(out[i+5:], w)
			binary.LittleEndian.PutUint16(out[i+7:], h)
			return out
		default:
			t.Fatalf("gifSized: byte %#x at %d", out[i], i)
		}
	}
	t.Fatal("gifSized: no image descriptor")
	return nil
}

// pngBomb is a PNG whose IHDR declares w×h 8-bit RGB, with one small IDAT (a zlib stream
// of zeros) as a real bomb has: the header is all a loader needs to refuse it.
func pngBomb(t testing.TB, w, h uint32) []byte {
	t.Helper()
	hdr := pngHeaderOnly(w, h)
	iend := hdr[len(hdr)-12:]
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write(make([]byte, 1<<16))
	zw.Close()
	idat := binary.BigEndian.AppendUint32(nil, uint32(z.Len()))
	body := append([]byte("IDAT"), z.Bytes()...)
	idat = append(idat, body...)
	idat = binary.BigEndian.AppendUint32(idat, crc32.ChecksumIEEE(body))
	out := append(append([]byte{}, hdr[:len(hdr)-12]...), idat...)
	return append(out, iend...)
}
