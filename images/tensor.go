package images

import (
	"fmt"
	"image"
)

// Normalisations of the app's models, as (mean, std, scale) for ToCHW / ToHWC.
var (
	// HalfMean and HalfStd with scale 1/255 give (x/255-0.5)/0.5, in [-1, 1]: PixAI and
	// OppaiOracle.
	HalfMean = [3]float32{0.5, 0.5, 0.5}
	HalfStd  = [3]float32{0.5, 0.5, 0.5}
	// ClipMean and ClipStd with scale 1/255 are CLIP's statistics: CCIP.
	ClipMean = [3]float32{0.48145466, 0.4578275, 0.40821073}
	ClipStd  = [3]float32{0.26862954, 0.2613026, 0.2757771}
	// ZeroMean and UnitStd only scale: with scale 1 raw 0-255 values (WD14), with
	// Scale255 [0, 1] (detect, segment).
	ZeroMean = [3]float32{0, 0, 0}
	UnitStd  = [3]float32{1, 1, 1}
)

// Scale255 is the scale that maps 0-255 bytes to [0, 1].
const Scale255 float32 = 1.0 / 255

// channelLUT holds, per tensor channel, the normalised value of each byte value: with it
// packing a pixel is three table loads, no arithmetic.
type channelLUT [3][256]float32

// fill computes (v*scale - mean[c]) / std[c] for every byte v, in float64 before
// rounding once to float32. (A 3 KiB table on the caller's stack: no allocation.)
func (t *channelLUT) fill(mean, std [3]float32, scale float32) {
	for c := range 3 {
		m, s := float64(mean[c]), float64(std[c])
		for v := range 256 {
			t[c][v] = float32((float64(v)*float64(scale) - m) / s)
		}
	}
}

// ToCHW writes img as one planar image of an NCHW tensor: dst[c*H*W + y*W + x] =
// (pixel*scale - mean[c]) / std[c]. Channel c is R, G, B, or B, G, R when bgr is set;
// mean and std are indexed by tensor channel (with bgr, index 0 is blue). dst must hold at
// least 3*W*H values (pass dst[i*3*W*H:] for the i-th image of a batch); ToCHW panics
// otherwise. Alpha is ignored and the RGB of *image.RGBA is premultiplied, so flatten
// transparent images first (FlattenOn).
//
// It reads Pix directly and maps bytes through lookup tables: about a millisecond or less
// for 448×448.
func ToCHW(img *image.RGBA, dst []float32, mean, std [3]float32, scale float32, bgr bool) {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	plane := w * h
	if len(dst) < 3*plane {
		panic(fmt.Sprintf("images: ToCHW destination holds %d values, need %d", len(dst), 3*plane))
	}
	var t channelLUT
	t.fill(mean, std, scale)
	// Plane and table for the source's R, G and B bytes.
	pr, pg, pb := dst[0:plane], dst[plane:2*plane], dst[2*plane:3*plane]
	lr, lg, lb := &t[0], &t[1], &t[2]
	if bgr {
		pr, pb = pb, pr
		lr, lb = lb, lr
	}
	for y := range h {
		off := img.PixOffset(img.Rect.Min.X, img.Rect.Min.Y+y)
		src := img.Pix[off : off+4*w : off+4*w]
		o := y * w
		dr, dg, db := pr[o:o+w:o+w], pg[o:o+w:o+w], pb[o:o+w:o+w]
		for x := range dr {
			p := src[4*x : 4*x+3 : 4*x+3]
			dr[x] = lr[p[0]]
			dg[x] = lg[p[1]]
			db[x] = lb[p[2]]
		}
	}
}

// ToHWC writes img as one interleaved image of an NHWC tensor: dst[(y*W + x)*3 + c] =
// (pixel*scale - mean[c]) / std[c], channels R, G, B or, with bgr, B, G, R (WD14 takes
// BGR with ZeroMean, UnitStd and scale 1, i.e. raw 0-255). The rest is as for ToCHW.
func ToHWC(img *image.RGBA, dst []float32, mean, std [3]float32, scale float32, bgr bool) {
	w, h := img.Rect.Dx(), img.Rect.Dy()
	n := 3 * w * h
	if len(dst) < n {
		panic(fmt.Sprintf("images: ToHWC destination holds %d values, need %d", len(dst), n))
	}
	var t channelLUT
	t.fill(mean, std, scale)
	l0, l1, l2 := &t[0], &t[1], &t[2]
	for y := range h {
		off := img.PixOffset(img.Rect.Min.X, img.Rect.Min.Y+y)
		src := img.Pix[off : off+4*w : off+4*w]
		o := 3 * y * w
		d := dst[o : o+3*w : o+3*w]
		if bgr {
			for x := range w {
				p := src[4*x : 4*x+3 : 4*x+3]
				q := d[3*x : 3*x+3 : 3*x+3]
				q[0], q[1], q[2] = l0[p[2]], l1[p[1]], l2[p[0]]
			}
		} else {
			for x := range w {
				p := src[4*x : 4*x+3 : 4*x+3]
				q := d[3*x : 3*x+3 : 3*x+3]
				q[0], q[1], q[2] = l0[p[0]], l1[p[1]], l2[p[2]]
			}
		}
	}
}
