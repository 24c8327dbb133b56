package images

import (
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// FuzzLoad feeds hostile bytes to the production decode path (libvips: the header, the
// pixel bound, then the thumbnail to a box). Whatever the bytes, it answers an image of
// the box or unsupported_image / image_too_large, and never crashes. The seed corpus is
// a small image of every format (generated: libvips writes them), whole and cut.
// The pixel bound is small so that each input stays fast.
func FuzzLoad(f *testing.F) {
	l := testenv.RequireVips(f)
	const w, h = 24, 16
	pic := picture(w, h)
	for _, suffix := range []string{".jpg[Q=80]", ".jpg[interlace]", ".png", ".png[palette]", ".webp", ".tif", ".gif", ".avif"} {
		b, err := l.Encode(pic, w, h, 3, suffix, "", 0)
		if err != nil {
			continue // a saver this build lacks
		}
		f.Add(b, uint8(0))
		f.Add(b[:len(b)/2], uint8(1))
	}
	if b, err := l.Encode(pic, w, h, 3, ".jpg", "", 6); err == nil {
		f.Add(b, uint8(2))
	}
	// Big enough for JPEG DCT scaling on load (200x150 to a 16 box: 1/8).
	if b, err := l.Encode(picture(200, 150), 200, 150, 3, ".jpg[Q=70]", "", 6); err == nil {
		f.Add(b, uint8(0))
		f.Add(b, uint8(2))
		f.Add(b[:len(b)*2/3], uint8(3))
	}
	if b, err := l.Encode(pic, w, h, 3, ".jpg", "cmyk", 0); err == nil {
		f.Add(b, uint8(3))
	}
	f.Add(pngBomb(f, 1000, 1000), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		spec := LoadSpec{Width: 16, Height: 16, Fill: Fill(mode % 4), KeepAlpha: mode&4 != 0, Background: WhiteRGBA}
		if spec.Fill == 1 { // not a fill Load offers: the whole image
			spec = LoadSpec{KeepAlpha: spec.KeepAlpha}
		}
		img, info, err := LoadBytes(data, 1<<16, spec)
		if err != nil {
			switch codec.CodeOf(err) {
			case codec.CodeUnsupportedImage, codec.CodeImageTooLarge:
				return
			}
			t.Fatalf("error %v is not unsupported_image or image_too_large", err)
		}
		b := img.Bounds()
		if b.Empty() || int64(info.Width)*int64(info.Height) > 1<<16 {
			t.Fatalf("image %v, info %+v", b, info)
		}
		if spec.Width == 0 && (b.Dx() != info.Width || b.Dy() != info.Height) {
			t.Fatalf("whole image %v, info %+v", b, info)
		}
		if spec.Width > 0 && info.Format != "bmp" && (b.Dx() > 16 || b.Dy() > 16) {
			t.Fatalf("box load %v over 16x16", b)
		}
	})
}
