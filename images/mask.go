package images

import (
	"fmt"
	"image"
	"math"

	"golang.org/x/image/draw"
)

// MaskToRGBA cuts img out with a segmentation mask (isnetis-style background removal):
// mask is mw×mh row-major values in [0, 1] (1 = keep), resized bilinearly to img's size;
// the result has img's colour and alpha = mask × img's own alpha. Values outside [0, 1]
// are clamped and NaN counts as 0. The result has origin (0, 0). It panics if mw or mh
// is not positive or mask is shorter than mw*mh: callers check the model's output shape.
func MaskToRGBA(img image.Image, mask []float32, mw, mh int) *image.NRGBA {
	if mw <= 0 || mh <= 0 || len(mask) < mw*mh {
		panic(fmt.Sprintf("images: MaskToRGBA: mask of %d values is not %dx%d", len(mask), mw, mh))
	}
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	out := image.NewNRGBA(image.Rect(0, 0, w, h))
	if w == 0 || h == 0 {
		return out
	}

	// The mask at 16 bits, scaled with a fast path into an RGBA whose R is the mask.
	src := image.NewGray16(image.Rect(0, 0, mw, mh))
	for i, m := range mask[:mw*mh] {
		v := uint16(math.Round(float64(clamp(float64(m), 0, 1)) * 0xffff))
		src.Pix[2*i], src.Pix[2*i+1] = byte(v>>8), byte(v)
	}
	alpha := image.NewRGBA(out.Rect)
	draw.BiLinear.Scale(alpha, alpha.Rect, src, src.Rect, draw.Src, nil)

	// img's colour, premultiplied, through draw's fast paths for the decoders' types.
	rgba, ok := img.(*image.RGBA)
	if !ok || rgba.Rect.Min != (image.Point{}) {
		rgba = image.NewRGBA(out.Rect)
		draw.Draw(rgba, rgba.Rect, img, b.Min, draw.Src)
	}

	for y := range h {
		s := rgba.Pix[y*rgba.Stride : y*rgba.Stride+4*w]
		m := alpha.Pix[y*alpha.Stride : y*alpha.Stride+4*w]
		d := out.Pix[y*out.Stride : y*out.Stride+4*w]
		for x := 0; x < 4*w; x += 4 {
			a := uint32(s[x+3])
			if a == 0 {
				d[x], d[x+1], d[x+2], d[x+3] = 0, 0, 0, 0
				continue
			}
			if a == 255 {
				d[x], d[x+1], d[x+2] = s[x], s[x+1], s[x+2]
			} else { // un-premultiply, rounding
				d[x] = byte((uint32(s[x])*255 + a/2) / a)
				d[x+1] = byte((uint32(s[x+1])*255 + a/2) / a)
				d[x+2] = byte((uint32(s[x+2])*255 + a/2) / a)
			}
			d[x+3] = byte((uint32(m[x])*a + 127) / 255)
		}
	}
	return out
}
