package onnxgen

// Test-input helpers: synthetic 8-bit images and the normalisations each
// model's caller applies, so tests here and in other packages can build the
// exact tensors (or PNG files) whose outputs the Ref functions predict.

// PixelFunc gives the 8-bit RGB colour of pixel (x, y).
type PixelFunc func(x, y int) [3]uint8

// Solid is a uniformly coloured image.
func Solid(rgb [3]uint8) PixelFunc {
	return func(int, int) [3]uint8 { return rgb }
}

// Split is an image of the given width whose left half (x < width/2) is
// left and right half is right. Split(white, black, 448) triggers the
// tagger's split_hero tag; Split(black, white, 448) triggers mirror_hero.
func Split(left, right [3]uint8, width int) PixelFunc {
	return func(x, _ int) [3]uint8 {
		if x < width/2 {
			return left
		}
		return right
	}
}

// Rect is a background bg with a rectangle fg covering x1 <= x < x2,
// y1 <= y < y2 (the detector reports exactly these edges for a saturated
// red fg).
func Rect(bg, fg [3]uint8, x1, y1, x2, y2 int) PixelFunc {
	return func(x, y int) [3]uint8 {
		if x >= x1 && x < x2 && y >= y1 && y < y2 {
			return fg
		}
		return bg
	}
}

// Norm maps an 8-bit value of channel c (0 R, 1 G, 2 B) to a model input
// value.
type Norm func(c int, v uint8) float32

// TaggerNorm is the tagger's normalisation: (v/255 - 0.5) / 0.5.
func TaggerNorm(_ int, v uint8) float32 {
	return float32((float64(v)/255 - 0.5) / 0.5)
}

// CCIPNorm is CCIP's normalisation: (v/255 - mean[c]) / std[c] with CLIP's
// mean and std.
func CCIPNorm(c int, v uint8) float32 {
	return float32((float64(v)/255 - float64(ccipMean[c])) / float64(ccipStd[c]))
}

// UnitNorm is the detector's and segmenter's normalisation: v/255.
func UnitNorm(_ int, v uint8) float32 {
	return float32(float64(v) / 255)
}

// NCHW renders images as one float32 tensor [len(imgs),3,size,size], each
// image sampled at size x size pixels and normalised by norm.
func NCHW(size int, norm Norm, imgs ...PixelFunc) []float32 {
	hw := size * size
	out := make([]float32, len(imgs)*3*hw)
	for i, img := range imgs {
		base := i * 3 * hw
		for y := 0; y < size; y++ {
			for x := 0; x < size; x++ {
				p := img(x, y)
				o := base + y*size + x
				out[o] = norm(0, p[0])
				out[hw+o] = norm(1, p[1])
				out[2*hw+o] = norm(2, p[2])
			}
		}
	}
	return out
}
