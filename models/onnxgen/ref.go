package onnxgen

import (
	"fmt"
	"math"
)

// Reference computations: each Ref function computes, in pure Go, what the
// corresponding generated model outputs for the same input tensor, with the
// same parameters (spec.go). Sums are taken in float64, so a runtime's
// float32 answer agrees to a few 1e-6 (measured with ONNX Runtime 1.24.3
// and 1.30.0: at most 2.1e-6); a comparison tolerance of 1e-4 is ample.
// Inputs are NCHW float32 slices laid out exactly as the models take them.
// The functions panic when a slice's length does not match the stated shape
// (a bug in the caller, not a run-time condition).

func checkLen(fn string, got, want int) {
	if got != want {
		panic(fmt.Sprintf("onnxgen.%s: input has %d values, want %d", fn, got, want))
	}
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// RefTagger returns the tagger's "prediction" [n,K] (K = len(TaggerTags),
// row-major) for "input" [n,3,448,448]. The heavy variant's side branch adds
// exactly zero, so this is also the heavy tagger's output.
func RefTagger(in []float32, n int) []float32 {
	const hw = TaggerSize * TaggerSize
	checkLen("RefTagger", len(in), n*3*hw)
	k := len(TaggerTags)
	w, b := taggerWeights()
	mask := splitMask()
	out := make([]float32, n*k)
	cols := make([]float64, TaggerSize)
	for i := 0; i < n; i++ {
		var feat [taggerFeatures]float64
		for c := 0; c < 3; c++ {
			plane := in[(i*3+c)*hw : (i*3+c+1)*hw]
			clear(cols)
			for y := 0; y < TaggerSize; y++ {
				for x, v := range plane[y*TaggerSize : (y+1)*TaggerSize] {
					cols[x] += float64(v)
				}
			}
			var sum, split float64
			for x, v := range cols {
				sum += v
				split += v * float64(mask[x])
			}
			feat[c] = sum / hw
			feat[3+c] = split / hw
		}
		for j := 0; j < k; j++ {
			logit := float64(b[j])
			for f := 0; f < taggerFeatures; f++ {
				logit += feat[f] * float64(w[f*k+j])
			}
			out[i*k+j] = float32(sigmoid(logit))
		}
	}
	return out
}

// RefCCIPFeature returns the CCIP feature model's "output" [n,768] for
// "input" [n,3,384,384].
func RefCCIPFeature(in []float32, n int) []float32 {
	const hw = CCIPSize * CCIPSize
	checkLen("RefCCIPFeature", len(in), n*3*hw)
	centre, w, bias := ccipParams()
	out := make([]float32, n*CCIPDim)
	for i := 0; i < n; i++ {
		var p [3]float64
		for c := 0; c < 3; c++ {
			var sum float64
			for _, v := range in[(i*3+c)*hw : (i*3+c+1)*hw] {
				sum += float64(v)
			}
			p[c] = sum/hw - float64(centre[c])
		}
		for j := 0; j < CCIPDim; j++ {
			v := float64(bias[j])
			for c := 0; c < 3; c++ {
				v += p[c] * float64(w[c*CCIPDim+j])
			}
			out[i*CCIPDim+j] = float32(v)
		}
	}
	return out
}

// RefCCIPMetrics returns the CCIP metrics model's "output" [n,n] (pairwise
// differences (1 - cosine)/2, symmetric, zero diagonal) for features
// [n,768].
func RefCCIPMetrics(feat []float32, n int) []float32 {
	checkLen("RefCCIPMetrics", len(feat), n*CCIPDim)
	norms := make([]float64, n)
	for i := range norms {
		var s float64
		for _, v := range feat[i*CCIPDim : (i+1)*CCIPDim] {
			s += float64(v) * float64(v)
		}
		norms[i] = math.Max(math.Sqrt(s), ccipEps)
	}
	out := make([]float32, n*n)
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			var dot float64
			a, b := feat[i*CCIPDim:(i+1)*CCIPDim], feat[j*CCIPDim:(j+1)*CCIPDim]
			for d := range a {
				dot += float64(a[d]) * float64(b[d])
			}
			diff := float32(math.Max(0, (1-dot/(norms[i]*norms[j]))/2))
			out[i*n+j], out[j*n+i] = diff, diff
		}
	}
	return out
}

// CCIPDifference is RefCCIPMetrics for one pair of features: the difference
// the generated CCIP reports between them.
func CCIPDifference(a, b []float32) float32 {
	return RefCCIPMetrics(append(append(make([]float32, 0, 2*CCIPDim), a...), b...), 2)[1]
}

// RefDetector returns the detector's "output0" [1,5,1] as five values
// cx, cy, w, h, score for "images" [1,3,640,640].
func RefDetector(in []float32) []float32 {
	const hw = DetectorSize * DetectorSize
	checkLen("RefDetector", len(in), 3*hw)
	cw, cb := detectorConv()
	cols := make([]bool, DetectorSize)
	rows := make([]bool, DetectorSize)
	score := 0.0
	for y := 0; y < DetectorSize; y++ {
		for x := 0; x < DetectorSize; x++ {
			p := y*DetectorSize + x
			z := float64(cw[0])*float64(in[p]) + float64(cw[1])*float64(in[hw+p]) +
				float64(cw[2])*float64(in[2*hw+p]) + float64(cb)
			if z > 0 {
				cols[x], rows[y] = true, true
				score = math.Max(score, sigmoid(z))
			}
		}
	}
	x1, x2 := span(cols)
	y1, y2 := span(rows)
	return []float32{
		float32((x1 + x2) / 2), float32((y1 + y2) / 2),
		float32(math.Max(0, x2-x1)), float32(math.Max(0, y2-y1)),
		float32(score),
	}
}

// span returns the detector's edge values for one axis: lo = the first set
// index and hi = the last set index + 1, or (640, 0) when none is set, as
// the graph's ramp construction gives.
func span(set []bool) (lo, hi float64) {
	lo, hi = DetectorSize, 0
	for i, s := range set {
		if s {
			lo = math.Min(lo, float64(i))
			hi = float64(i + 1)
		}
	}
	return lo, hi
}

// DetectorBox converts the detector's five outputs (cx, cy, w, h, score) to
// corner coordinates in the 640x640 input.
func DetectorBox(out []float32) (x1, y1, x2, y2, score float32) {
	return out[0] - out[2]/2, out[1] - out[3]/2, out[0] + out[2]/2, out[1] + out[3]/2, out[4]
}

// RefSegmenter returns the segmenter's "mask" [1,1,1024,1024] for "img"
// [1,3,1024,1024].
func RefSegmenter(in []float32) []float32 {
	const hw = SegmenterSize * SegmenterSize
	checkLen("RefSegmenter", len(in), 3*hw)
	cw, cb := segmenterConv()
	out := make([]float32, hw)
	for p := range out {
		z := float64(cw[0])*float64(in[p]) + float64(cw[1])*float64(in[hw+p]) +
			float64(cw[2])*float64(in[2*hw+p]) + float64(cb)
		out[p] = float32(sigmoid(z))
	}
	return out
}

// RefTiny returns the tiny model's "y" for "x" (any [N,4]): x*2 + 1.
func RefTiny(in []float32) []float32 {
	if len(in)%TinyDim != 0 {
		panic(fmt.Sprintf("onnxgen.RefTiny: input has %d values, not a multiple of %d", len(in), TinyDim))
	}
	out := make([]float32, len(in))
	for i, v := range in {
		out[i] = float32(v*tinyMul) + tinyAdd // rounded like Mul then Add
	}
	return out
}

// RefScalar returns the scalar model's outputs for x ([N,3]) and k: sum = Σx·k,
// count = len(x), y = x·k (each rounded as the model's float32 ops round them; sum adds
// in order, which ReduceSum matches to float rounding for a few values).
func RefScalar(x []float32, k float32) (sum float32, count int64, y []float32) {
	if len(x)%ScalarWidth != 0 {
		panic(fmt.Sprintf("onnxgen.RefScalar: x has %d values, not a multiple of %d", len(x), ScalarWidth))
	}
	y = make([]float32, len(x))
	for i, v := range x {
		sum += v
		y[i] = v * k
	}
	return sum * k, int64(len(x)), y
}
