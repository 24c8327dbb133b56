package onnxgen

import (
	"math"
	"math/rand/v2"
)

// This file is the single source of truth for the generated models'
// parameters: gen.go writes them into the graphs and ref.go computes with
// the very same values, so a runtime's output can be compared with the
// reference to float rounding.

// Input sizes and output widths of the generated models (they match the real
// models' contracts).
const (
	TaggerSize    = 448  // tagger input is [N,3,448,448]
	CCIPSize      = 384  // CCIP feature input is [N,3,384,384]
	CCIPDim       = 768  // CCIP feature width: [N,768]
	DetectorSize  = 640  // detector input is [1,3,640,640]
	SegmenterSize = 1024 // isnetis input is [1,3,1024,1024], mask [1,1,1024,1024]
	TinyDim       = 4    // tiny model: [N,4] -> [N,4]
	ScalarWidth   = 3    // scalar model: x is [N,3]
)

// ConstAnswer and ConstTable are the const model's outputs "answer" and "table" ([2,3]).
const ConstAnswer = 42

var ConstTable = []float32{0.5, 1.5, 2.5, -1, -2, 1e6}

// CCIPThreshold is the generated CCIP's same-character threshold (written to
// ccip/metrics.json): same character when difference <= CCIPThreshold. It is
// the real model's value; the generated features make same-colour pairs
// differ by ~0 and different corner colours by > 0.33.
const CCIPThreshold = 0.17847511429108218

// DetectorConf is the person detector's usual confidence threshold; the
// generated detector scores 0.9933 on a saturated red rectangle and exactly
// 0 on an image without red.
const DetectorConf = 0.25

// Tag categories as used in selected_tags.csv.
const (
	CategoryGeneral   = 0
	CategoryCharacter = 4
	CategoryRating    = 9
)

// Colour is one of the eight RGB cube corners.
type Colour struct {
	Name string
	RGB  [3]uint8
}

// Colours lists the eight RGB cube corners in tag-id order: Colours[i] is
// the general tag with id i.
var Colours = []Colour{
	{"black", [3]uint8{0, 0, 0}},
	{"white", [3]uint8{255, 255, 255}},
	{"red", [3]uint8{255, 0, 0}},
	{"green", [3]uint8{0, 255, 0}},
	{"blue", [3]uint8{0, 0, 255}},
	{"yellow", [3]uint8{255, 255, 0}},
	{"cyan", [3]uint8{0, 255, 255}},
	{"magenta", [3]uint8{255, 0, 255}},
}

// ColourNames maps each corner colour's tag name to its RGB value.
var ColourNames = func() map[string][3]uint8 {
	m := make(map[string][3]uint8, len(Colours))
	for _, c := range Colours {
		m[c.Name] = c.RGB
	}
	return m
}()

// Tag is one row of the generated tagger's selected_tags.csv. ID is the
// score index (prediction[n][ID]).
type Tag struct {
	ID       int
	TagID    int
	Name     string
	Category int
	Count    int
	IPs      []string
	// Threshold is the tag's row in thresholds.csv; 0 means the tag has no
	// row there (the app then uses its fallback, 0.4).
	Threshold float64
}

// Names of the non-colour tags of the generated tagger.
const (
	// TagSplitHero (character) fires when the left half of the image is
	// white and the right half black; no uniform colour triggers it.
	TagSplitHero = "split_hero"
	// TagMirrorHero (character) fires for the mirrored pattern: left half
	// black, right half white.
	TagMirrorHero = "mirror_hero"
)

// TaggerTags is the generated tagger's vocabulary, in id order: the eight
// corner colours (general), split_hero and mirror_hero (character), and four
// ratings whose scores are constant (general 0.953, sensitive 0.182,
// questionable 0.047, explicit 0.018). Treat it as read-only.
var TaggerTags = []Tag{
	{ID: 0, Name: "black", Category: CategoryGeneral, Threshold: 0.5},
	{ID: 1, Name: "white", Category: CategoryGeneral, Threshold: 0.5},
	{ID: 2, Name: "red", Category: CategoryGeneral, Threshold: 0.5},
	{ID: 3, Name: "green", Category: CategoryGeneral, Threshold: 0.5},
	{ID: 4, Name: "blue", Category: CategoryGeneral},
	{ID: 5, Name: "yellow", Category: CategoryGeneral},
	{ID: 6, Name: "cyan", Category: CategoryGeneral},
	{ID: 7, Name: "magenta", Category: CategoryGeneral},
	{ID: 8, Name: TagSplitHero, Category: CategoryCharacter, IPs: []string{"test_franchise"}, Threshold: 0.7},
	{ID: 9, Name: TagMirrorHero, Category: CategoryCharacter, IPs: []string{"test_franchise", "mirror_world"}, Threshold: 0.7},
	{ID: 10, Name: "general", Category: CategoryRating},
	{ID: 11, Name: "sensitive", Category: CategoryRating},
	{ID: 12, Name: "questionable", Category: CategoryRating},
	{ID: 13, Name: "explicit", Category: CategoryRating},
}

func init() {
	// Fill the columns that are only decorative: a Danbooru-like tag_id and
	// a count that falls with the id.
	for i := range TaggerTags {
		TaggerTags[i].TagID = 1000 + 7*i
		TaggerTags[i].Count = 100000 - 5000*i
	}
}

// TaggerTagIndex returns the id of the named tag, or -1.
func TaggerTagIndex(name string) int {
	for _, t := range TaggerTags {
		if t.Name == name {
			return t.ID
		}
	}
	return -1
}

// Tagger construction constants. The tagger sees six features per image:
// the mean of each channel (f0..f2, in [-1,1]) and the mean of each channel
// multiplied by the left/right mask (+1 on the left half, -1 on the right;
// f3..f5). logits = features · W + B; prediction = sigmoid(logits).
const (
	taggerFeatures = 6
	// colourGain is "a": logit_c = a*(s_c·f - 2), so the matching corner
	// gets +a (0.9933) and every other corner at most -a (0.0067).
	colourGain = 5
	// splitGain is "b": logit = b*(±(f3+f4+f5) - 1.5), so the pattern gets
	// +1.5b (0.9975) and any uniform image (f3..f5 = 0) gets -1.5b.
	splitGain = 4
)

// ratingLogits are the constant logits of the four rating tags.
var ratingLogits = [4]float32{3, -1.5, -3, -4}

// colourSigns returns the ±1 sign vector of a corner colour in normalised
// tagger space (0 -> -1, 255 -> +1).
func colourSigns(c Colour) [3]float32 {
	var s [3]float32
	for i, v := range c.RGB {
		s[i] = -1
		if v >= 128 {
			s[i] = 1
		}
	}
	return s
}

// taggerWeights returns W [6,K] (row-major) and B [K].
func taggerWeights() (w, b []float32) {
	k := len(TaggerTags)
	w = make([]float32, taggerFeatures*k)
	b = make([]float32, k)
	for i, c := range Colours {
		s := colourSigns(c)
		for ch := 0; ch < 3; ch++ {
			w[ch*k+i] = colourGain * s[ch]
		}
		b[i] = -2 * colourGain
	}
	split, mirror := TaggerTagIndex(TagSplitHero), TaggerTagIndex(TagMirrorHero)
	for ch := 3; ch < 6; ch++ {
		w[ch*k+split] = splitGain
		w[ch*k+mirror] = -splitGain
	}
	b[split] = -1.5 * splitGain
	b[mirror] = -1.5 * splitGain
	for i, l := range ratingLogits {
		b[TaggerTagIndex("general")+i] = l
	}
	return w, b
}

// splitMask returns the [448] left/right mask: +1 on the left half, -1 on
// the right (exactly zero mean, so a uniform image gives f3..f5 = 0).
func splitMask() []float32 {
	m := make([]float32, TaggerSize)
	for x := range m {
		m[x] = 1
		if x >= TaggerSize/2 {
			m[x] = -1
		}
	}
	return m
}

// CLIP normalisation used by CCIP's caller.
var (
	ccipMean = [3]float32{0.48145466, 0.4578275, 0.40821073}
	ccipStd  = [3]float32{0.26862954, 0.2613026, 0.2757771}
)

// ccipBiasNorm is the length of the constant component added to every CCIP
// feature, so that no image (e.g. exactly mid-grey) has a zero feature. For
// corner colours the feature is a ±1 sign vector (length √3) embedded
// orthonormally plus this bias, so different corners have cosine at most
// (1+0.01)/(3+0.01) and difference >= 0.33.
const ccipBiasNorm = 0.1

// ccipParams returns the CCIP feature model's parameters: centre [3] (the
// midpoint of each channel's normalised [0,1] range), W [3,768] (row r is
// the orthonormal direction E_r divided by the half range, so corners map to
// ±E_r) and bias [768] (ccipBiasNorm along a fourth orthonormal direction).
//
// The directions have disjoint supports (each index 0..767 belongs to one of
// four rows, chosen by a fixed-seed shuffle, with a random sign), so they are
// exactly orthogonal and the construction needs no floating-point
// orthogonalisation that could vary between machines.
func ccipParams() (centre [3]float32, w, bias []float32) {
	// Only PCG's raw output is used (its algorithm is fixed), never the
	// higher-level helpers of math/rand/v2, whose algorithms may change.
	rng := rand.NewPCG(0x0cc1b, 0x5eed)
	perm := make([]int, CCIPDim)
	for i := range perm {
		perm[i] = i
	}
	for i := len(perm) - 1; i > 0; i-- {
		j := int(rng.Uint64() % uint64(i+1))
		perm[i], perm[j] = perm[j], perm[i]
	}
	per := CCIPDim / 4
	amp := float32(1 / math.Sqrt(float64(per)))
	var dirs [4][]float32
	for r := range dirs {
		dirs[r] = make([]float32, CCIPDim)
		for _, idx := range perm[r*per : (r+1)*per] {
			if rng.Uint64()&1 == 0 {
				dirs[r][idx] = amp
			} else {
				dirs[r][idx] = -amp
			}
		}
	}
	w = make([]float32, 3*CCIPDim)
	for ch := 0; ch < 3; ch++ {
		lo := -ccipMean[ch] / ccipStd[ch]
		hi := (1 - ccipMean[ch]) / ccipStd[ch]
		centre[ch] = (lo + hi) / 2
		inv := 2 / (hi - lo) // 1 / half range
		for j := 0; j < CCIPDim; j++ {
			w[ch*CCIPDim+j] = dirs[ch][j] * inv
		}
	}
	bias = make([]float32, CCIPDim)
	for j := range bias {
		bias[j] = dirs[3][j] * ccipBiasNorm
	}
	return centre, w, bias
}

// ccipEps guards the metrics model's normalisation against a zero feature.
const ccipEps = 1e-12

// Detector construction: z = detGain*(r - (g+b)/2 - detThreshold) per pixel
// (a 1x1 convolution); a pixel is "red" when z > 0; the score is the max of
// sigmoid(z) over red pixels (0 when there is none). Pure red has redness 1
// (z = +5), yellow and magenta 0.5 (z = -5), greys and white 0. The
// threshold lies halfway between two values that 8-bit inputs can take
// (redness*510 = 2R-G-B is an integer; 0.75*510 = 382.5), so float rounding
// never flips a pixel of an 8-bit image. An anti-aliased edge pixel counts
// when more than 75% of it is red.
const (
	detGain      = 20
	detThreshold = 0.75
)

// detectorConv returns the 1x1 convolution weights [3] and bias.
func detectorConv() (w [3]float32, b float32) {
	return [3]float32{detGain, -detGain / 2, -detGain / 2}, -detGain * detThreshold
}

// Segmenter construction: mask = sigmoid(segGain*(segLevel - mean(r,g,b))),
// ~1 on anything darker than light grey, 0.0067 on pure white.
const (
	segGain  = 50
	segLevel = 0.9
)

// segmenterConv returns the 1x1 convolution weights [3] and bias.
func segmenterConv() (w [3]float32, b float32) {
	return [3]float32{-segGain / 3.0, -segGain / 3.0, -segGain / 3.0}, segGain * segLevel
}

// Tiny model: y = x*tinyMul + tinyAdd.
const (
	tinyMul = 2
	tinyAdd = 1
)
