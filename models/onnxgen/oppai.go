package onnxgen

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
)

// The generated OppaiOracle-style tagger (OppaiOracle v1.1's I/O contract).
//
// Files, under <dir>/OppaiDir: model.onnx, vocabulary.json ({"tag_to_index": {name: idx}})
// and pr_thresholds.json ({"thresholds": {name: threshold}}: per-tag thresholds for the
// tags that have one; every other tag uses the app's fallback, OppaiFallbackThreshold).
//
// Inputs: "pixel_values" float [N,3,448,448] (letterboxed to 448 without upscaling, pad
// (114,114,114), RGB, (x/255-0.5)/0.5) and "padding_mask" bool [N,448,448] (true =
// padding). Output: "tag_logits" float [N,K], already sigmoid-ed (probabilities, as the
// real model's ONNX export gives them despite the name).
//
// The model averages each channel over the non-padding pixels only, so a letterboxed
// image's grey bars do not dilute its colour: a uniform corner-colour image gets its
// colour tag >= 0.9 and the other seven < 0.1 whatever its aspect ratio (with an
// all-false mask the bars would count, and a 300x200 red image would score red ~0.006).
const (
	OppaiDir            = "oppai"
	OppaiVocabularyFile = "vocabulary.json"
	OppaiThresholdsFile = "pr_thresholds.json"

	OppaiSize = 448 // input is [N,3,448,448], mask [N,448,448]

	// OppaiFallbackThreshold is the app's threshold for a tag without its own row in
	// pr_thresholds.json.
	OppaiFallbackThreshold = 0.760

	// OppaiPad and OppaiUnk are the vocabulary's special entries (indices 0 and 1, as in
	// the real vocabulary). Their scores are constant and high (0.9975), so a consumer
	// that forgets to skip them is caught.
	OppaiPad = "<PAD>"
	OppaiUnk = "<UNK>"

	// OppaiRatingPrefix starts the names of the rating entries ("rating:general", ...).
	OppaiRatingPrefix = "rating:"

	// OppaiMidTag scores a constant 0.6225: below the fallback threshold, so it is not
	// tagged by default, but kept when a request lowers the general threshold to 0.6.
	OppaiMidTag = "simple_background"
	// OppaiStrictTag scores a constant 0.8: above the fallback, but below its own
	// pr_thresholds.json threshold (0.85), so it is tagged only when a request lowers
	// the threshold; it proves the per-tag thresholds are used.
	OppaiStrictTag = "highres"
)

// oppaiEntry is one vocabulary entry of the generated model: a colour tag (colour >= 0,
// an index into Colours) or a constant-score tag (logit).
type oppaiEntry struct {
	name      string
	colour    int
	logit     float32
	threshold float64 // pr_thresholds.json value; 0 = none (fallback)
}

// oppaiEntries returns the vocabulary in index order: <PAD>, <UNK>, the eight colours,
// OppaiMidTag, OppaiStrictTag and four ratings (general 0.953, sensitive 0.182,
// questionable 0.047, explicit 0.018).
func oppaiEntries() []oppaiEntry {
	e := []oppaiEntry{
		{name: OppaiPad, colour: -1, logit: 6},
		{name: OppaiUnk, colour: -1, logit: 6},
	}
	for i, c := range Colours {
		th := 0.0
		if i%2 == 0 { // half the colours carry their own threshold, half use the fallback
			th = 0.5
		}
		e = append(e, oppaiEntry{name: c.Name, colour: i, threshold: th})
	}
	e = append(e,
		oppaiEntry{name: OppaiMidTag, colour: -1, logit: 0.5},
		oppaiEntry{name: OppaiStrictTag, colour: -1, logit: float32(math.Log(4)), threshold: 0.85},
	)
	for i, r := range []string{"general", "sensitive", "questionable", "explicit"} {
		e = append(e, oppaiEntry{name: OppaiRatingPrefix + r, colour: -1, logit: ratingLogits[i]})
	}
	return e
}

// OppaiTags returns the generated model's vocabulary in index order (tag_logits[n][i] is
// the score of OppaiTags()[i]), special entries included.
func OppaiTags() []string {
	es := oppaiEntries()
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.name
	}
	return out
}

// OppaiThresholds returns the per-tag thresholds written to pr_thresholds.json.
func OppaiThresholds() map[string]float64 {
	m := map[string]float64{}
	for _, e := range oppaiEntries() {
		if e.threshold > 0 {
			m[e.name] = e.threshold
		}
	}
	return m
}

// oppaiWeights returns W [3,K] (row-major) and B [K]: a colour tag's logit is
// colourGain*(s_c·f - 2) as in the PixAI-style tagger, f being the masked channel means.
func oppaiWeights() (w, b []float32) {
	es := oppaiEntries()
	k := len(es)
	w = make([]float32, 3*k)
	b = make([]float32, k)
	for j, e := range es {
		if e.colour < 0 {
			b[j] = e.logit
			continue
		}
		s := colourSigns(Colours[e.colour])
		for ch := 0; ch < 3; ch++ {
			w[ch*k+j] = colourGain * s[ch]
		}
		b[j] = -2 * colourGain
	}
	return w, b
}

// OppaiGraph builds the model:
//
//	valid = Unsqueeze(Cast(Not(padding_mask), float), 1)       [N,1,H,W]
//	sum   = ReduceSum(ReduceSum(pixel_values * valid, H), W)   [N,3,1,1]
//	count = Max(ReduceSum(ReduceSum(valid, H), W), 1)          [N,1,1,1]
//	feat  = Flatten(sum / count)                               [N,3]
//	tag_logits = Sigmoid(feat · W + B)                         [N,K]
//
// The sums run in two stages of 448 values each (see TaggerGraph for why); an all-padding
// mask gives zero features rather than a division by zero.
func OppaiGraph() *Graph {
	k := int64(len(oppaiEntries()))
	g := NewGraph("onnxgen_oppai")
	g.AddInput("pixel_values", Float, "N", 3, OppaiSize, OppaiSize)
	g.AddInput("padding_mask", Bool, "N", OppaiSize, OppaiSize)
	g.AddOutput("tag_logits", Float, "N", int(k))

	w, b := oppaiWeights()
	wName := g.AddFloat("head_w", []int64{3, k}, w)
	bName := g.AddFloat("head_b", []int64{k}, b)
	axis1 := g.AddInt64("axis_c", []int64{1}, []int64{1})
	axisH := g.AddInt64("axis_h", []int64{1}, []int64{2})
	axisW := g.AddInt64("axis_w", []int64{1}, []int64{3})

	valid := g.Op("Cast", []string{g.Op("Not", []string{"padding_mask"})}, AttrInt("to", int64(Float)))
	valid = g.Op("Unsqueeze", []string{valid, axis1})
	keep := AttrInt("keepdims", 1)
	sum2 := func(x string) string {
		return g.Op("ReduceSum", []string{g.Op("ReduceSum", []string{x, axisH}, keep), axisW}, keep)
	}
	sum := sum2(g.Op("Mul", []string{"pixel_values", valid}))
	count := g.Op("Max", []string{sum2(valid), g.Scalar(1)})
	feat := g.Op("Flatten", []string{g.Op("Div", []string{sum, count})}, AttrInt("axis", 1))
	logits := g.Op("Add", []string{g.Op("MatMul", []string{feat, wName}), bName})
	g.AddNode("Sigmoid", []string{logits}, []string{"tag_logits"})
	return g
}

// oppaiVocabularyJSON renders vocabulary.json: {"tag_to_index": {name: index}}.
func oppaiVocabularyJSON() ([]byte, error) {
	idx := map[string]int{}
	for i, name := range OppaiTags() {
		idx[name] = i
	}
	b, err := json.MarshalIndent(map[string]any{"tag_to_index": idx}, "", "  ")
	return append(b, '\n'), err
}

// oppaiThresholdsJSON renders pr_thresholds.json: {"thresholds": {name: threshold}}.
func oppaiThresholdsJSON() ([]byte, error) {
	b, err := json.MarshalIndent(map[string]any{"thresholds": OppaiThresholds()}, "", "  ")
	return append(b, '\n'), err
}

// GenerateOppai writes the OppaiOracle-style model and its side files under
// <dir>/OppaiDir (model.onnx, vocabulary.json, pr_thresholds.json). Like Generate it is
// deterministic and leaves files whose content is already right untouched.
func GenerateOppai(dir string) error {
	vocab, err := oppaiVocabularyJSON()
	if err != nil {
		return fmt.Errorf("onnxgen: oppai vocabulary: %w", err)
	}
	thr, err := oppaiThresholdsJSON()
	if err != nil {
		return fmt.Errorf("onnxgen: oppai thresholds: %w", err)
	}
	files := []genFile{
		{filepath.Join(OppaiDir, ModelFile), func() []byte { return OppaiGraph().Bytes() }},
		{filepath.Join(OppaiDir, OppaiVocabularyFile), func() []byte { return vocab }},
		{filepath.Join(OppaiDir, OppaiThresholdsFile), func() []byte { return thr }},
	}
	for _, f := range files {
		if err := writeIfChanged(filepath.Join(dir, f.path), f.data()); err != nil {
			return fmt.Errorf("onnxgen: generate %s: %w", f.path, err)
		}
	}
	return nil
}

// RefOppai returns the model's "tag_logits" [n,K] (K = len(OppaiTags())) for
// "pixel_values" [n,3,448,448] and "padding_mask" [n,448,448]. A nil mask means no
// padding (all false).
func RefOppai(pixels []float32, mask []bool, n int) []float32 {
	const hw = OppaiSize * OppaiSize
	checkLen("RefOppai", len(pixels), n*3*hw)
	if mask != nil {
		checkLen("RefOppai mask", len(mask), n*hw)
	}
	w, b := oppaiWeights()
	k := len(b)
	out := make([]float32, n*k)
	for i := 0; i < n; i++ {
		var m []bool
		if mask != nil {
			m = mask[i*hw : (i+1)*hw]
		}
		count := 0.0
		for p := 0; p < hw; p++ {
			if m == nil || !m[p] {
				count++
			}
		}
		count = math.Max(count, 1)
		var feat [3]float64
		for c := 0; c < 3; c++ {
			var sum float64
			for p, v := range pixels[(i*3+c)*hw : (i*3+c+1)*hw] {
				if m == nil || !m[p] {
					sum += float64(v)
				}
			}
			feat[c] = sum / count
		}
		for j := 0; j < k; j++ {
			logit := float64(b[j])
			for c := 0; c < 3; c++ {
				logit += feat[c] * float64(w[c*k+j])
			}
			out[i*k+j] = float32(sigmoid(logit))
		}
	}
	return out
}

// OppaiTagIndex returns the index of the named vocabulary entry, or -1.
func OppaiTagIndex(name string) int {
	for i, t := range OppaiTags() {
		if t == name {
			return i
		}
	}
	return -1
}
