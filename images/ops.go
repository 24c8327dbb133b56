package images

import (
	"image"
	"image/color"
	"math"

	"golang.org/x/image/draw"
)

// Colours the model kinds pad and flatten with.
var (
	// White is the background taggers and CCIP flatten alpha onto, and WD14 pads with.
	White color.Color = color.RGBA{255, 255, 255, 255}
	// LetterboxGray is the (114, 114, 114) padding of YOLO-style detectors and OppaiOracle.
	LetterboxGray color.Color = color.RGBA{114, 114, 114, 255}
	// WhiteRGBA is White as a color.RGBA, the background Load flattens onto.
	WhiteRGBA = color.RGBA{255, 255, 255, 255}
)

// FlattenOn alpha-composites img over a solid bg and returns the result at origin (0,0).
// With an opaque bg the result is opaque, so its RGB can be fed to a model that has no
// alpha input (transparent pixels become bg rather than black). An opaque *image.RGBA at
// origin (what Load returns with alpha flattened) is returned as it is, not copied: the
// result is for reading.
func FlattenOn(img image.Image, bg color.Color) *image.RGBA {
	if m, ok := img.(*image.RGBA); ok && m.Rect.Min == (image.Point{}) && m.Opaque() {
		return m
	}
	b := img.Bounds()
	dst := image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	if isOpaqueType(img) {
		// Nothing shows through: a plain copy, which has fast paths for YCbCr (JPEG) etc.
		draw.Draw(dst, dst.Rect, img, b.Min, draw.Src)
		return dst
	}
	draw.Draw(dst, dst.Rect, image.NewUniform(bg), image.Point{}, draw.Src)
	draw.Draw(dst, dst.Rect, img, b.Min, draw.Over)
	return dst
}

// isOpaqueType reports whether img's type has no alpha channel at all, so flattening is a
// copy; checking the type costs nothing, unlike scanning the pixels with Opaque().
func isOpaqueType(img image.Image) bool {
	switch img.(type) {
	case *image.YCbCr, *image.Gray, *image.Gray16, *image.CMYK:
		return true
	}
	return false
}

// Resize scales img to exactly w×h (aspect ratio not kept) with interp, for example
// draw.BiLinear (the "triangle" filter; like PIL it widens the kernel when shrinking, so
// it antialiases), draw.CatmullRom (bicubic) or draw.NearestNeighbor. A nil interp means
// draw.BiLinear. w and h must be positive; an image already w×h is copied as it is, or,
// when it is an *image.RGBA at origin (Load brought it to the size), returned as it is:
// the result is for reading. Alpha is kept (premultiplied, as in *image.RGBA).
func Resize(img image.Image, w, h int, interp draw.Interpolator) *image.RGBA {
	if w <= 0 || h <= 0 {
		panic("images: Resize to a non-positive size")
	}
	if m, ok := img.(*image.RGBA); ok && m.Rect == image.Rect(0, 0, w, h) {
		return m
	}
	if interp == nil {
		interp = draw.BiLinear
	}
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	if b := img.Bounds(); b.Dx() == w && b.Dy() == h {
		// Already the size (Load brought it so): a copy, no resampling.
		draw.Draw(dst, dst.Rect, img, b.Min, draw.Src)
		return dst
	}
	interp.Scale(dst, dst.Rect, img, img.Bounds(), draw.Src, nil)
	return dst
}

// PadSquare centres img on a bg square whose side is img's longer side (WD14's "pad to
// square on white"). img is composited over bg, so any transparency shows bg. When the
// difference of the sides is odd, the extra pixel of padding goes right or bottom.
func PadSquare(img image.Image, bg color.Color) *image.RGBA {
	b := img.Bounds()
	side := max(b.Dx(), b.Dy())
	dst := image.NewRGBA(image.Rect(0, 0, side, side))
	draw.Draw(dst, dst.Rect, image.NewUniform(bg), image.Point{}, draw.Src)
	at := image.Pt((side-b.Dx())/2, (side-b.Dy())/2)
	draw.Draw(dst, image.Rectangle{Min: at, Max: at.Add(b.Size())}, img, b.Min, draw.Over)
	return dst
}

// LetterboxInfo records how Letterbox placed the image, to map model outputs back.
type LetterboxInfo struct {
	// Scale is the gain applied to the source: min(Size/SrcW, Size/SrcH), capped at 1
	// when upscaling was not allowed.
	Scale float64
	// PadX and PadY are the left and top padding in letterboxed pixels.
	PadX, PadY float64
	// Size is the side of the letterboxed square.
	Size int
	// SrcW and SrcH are the source image's size.
	SrcW, SrcH int
	// ContentW and ContentH are the size of the drawn image inside the square
	// (round(SrcW*Scale), round(SrcH*Scale)).
	ContentW, ContentH int
}

// Letterbox scales img by a single factor to fit a size×size square, centred on pad (the
// YOLO / OppaiOracle preprocessing). With upscale false an image smaller than the square
// is not enlarged, only padded. Resampling is draw.BiLinear (antialiased when shrinking).
// size must be positive.
func Letterbox(img image.Image, size int, pad color.Color, upscale bool) (*image.RGBA, LetterboxInfo) {
	if size <= 0 {
		panic("images: Letterbox to a non-positive size")
	}
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	li := LetterboxInfo{Size: size, SrcW: w, SrcH: h}
	dst := image.NewRGBA(image.Rect(0, 0, size, size))
	draw.Draw(dst, dst.Rect, image.NewUniform(pad), image.Point{}, draw.Src)
	if w <= 0 || h <= 0 {
		return dst, li
	}
	li.Scale = math.Min(float64(size)/float64(w), float64(size)/float64(h))
	if !upscale && li.Scale > 1 {
		li.Scale = 1
	}
	li.ContentW = min(size, max(1, int(math.Round(float64(w)*li.Scale))))
	li.ContentH = min(size, max(1, int(math.Round(float64(h)*li.Scale))))
	px, py := (size-li.ContentW)/2, (size-li.ContentH)/2
	li.PadX, li.PadY = float64(px), float64(py)
	r := image.Rect(px, py, px+li.ContentW, py+li.ContentH)
	if li.ContentW == w && li.ContentH == h {
		draw.Draw(dst, r, img, b.Min, draw.Over)
	} else {
		draw.BiLinear.Scale(dst, r, img, b, draw.Over, nil)
	}
	return dst, li
}

// WithSource re-bases li on the full image (w×h, upright) that the letterboxed image was
// loaded from at a smaller size (Load's box), so that ToOriginal and MapBox map to the full
// image's coordinates.
func (li LetterboxInfo) WithSource(w, h int) LetterboxInfo {
	if w <= 0 || h <= 0 || (w == li.SrcW && h == li.SrcH) {
		return li
	}
	li.SrcW, li.SrcH = w, h
	li.Scale = math.Min(float64(li.ContentW)/float64(w), float64(li.ContentH)/float64(h))
	return li
}

// ToOriginal maps a point from letterboxed coordinates to source-image coordinates,
// clamped to [0, SrcW]×[0, SrcH]. It uses the exact per-axis ratio of the drawn content
// (ContentW/SrcW), which differs from Scale by the rounding of the content size.
func (li LetterboxInfo) ToOriginal(x, y float64) (float64, float64) {
	if li.ContentW <= 0 || li.ContentH <= 0 {
		return 0, 0
	}
	ox := (x - li.PadX) * float64(li.SrcW) / float64(li.ContentW)
	oy := (y - li.PadY) * float64(li.SrcH) / float64(li.ContentH)
	return clamp(ox, 0, float64(li.SrcW)), clamp(oy, 0, float64(li.SrcH))
}

// MapBox maps a box (x1, y1, x2, y2) from letterboxed coordinates, as a detector outputs
// it, to source-image coordinates, clamped to the image. A box entirely in the padding
// collapses to zero width or height on the image's edge.
func (li LetterboxInfo) MapBox(x1, y1, x2, y2 float64) (ox1, oy1, ox2, oy2 float64) {
	ox1, oy1 = li.ToOriginal(x1, y1)
	ox2, oy2 = li.ToOriginal(x2, y2)
	return ox1, oy1, ox2, oy2
}

// IsPadding reports whether letterboxed pixel (x, y) is padding rather than image.
func (li LetterboxInfo) IsPadding(x, y int) bool {
	px, py := int(li.PadX), int(li.PadY)
	return x < px || y < py || x >= px+li.ContentW || y >= py+li.ContentH
}

// PaddingMask fills dst (length Size*Size, row-major) with true where the letterboxed
// square is padding: OppaiOracle's padding_mask input ([1, H, W] bool, true = padding).
func (li LetterboxInfo) PaddingMask(dst []bool) {
	n := li.Size * li.Size
	if len(dst) < n {
		panic("images: PaddingMask destination shorter than Size*Size")
	}
	for y := range li.Size {
		row := dst[y*li.Size : (y+1)*li.Size]
		for x := range row {
			row[x] = li.IsPadding(x, y)
		}
	}
}

func clamp(v, lo, hi float64) float64 {
	if v < lo || math.IsNaN(v) {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}
