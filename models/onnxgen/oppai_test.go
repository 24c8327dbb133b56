package onnxgen

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// oppaiLetterboxed returns the OppaiOracle input of a uniform w x h image of colour rgb
// (w, h <= OppaiSize, so it is not scaled) centred on the grey letterbox: pixel_values
// [1,3,448,448] and padding_mask [1,448,448].
func oppaiLetterboxed(rgb [3]uint8, w, h int) ([]float32, []bool) {
	px, py := (OppaiSize-w)/2, (OppaiSize-h)/2
	pixels := NCHW(OppaiSize, TaggerNorm, Rect(grey, rgb, px, py, px+w, py+h))
	mask := make([]bool, OppaiSize*OppaiSize)
	for y := 0; y < OppaiSize; y++ {
		for x := 0; x < OppaiSize; x++ {
			mask[y*OppaiSize+x] = x < px || x >= px+w || y < py || y >= py+h
		}
	}
	return pixels, mask
}

func TestGenerateOppai(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	if err := GenerateOppai(a); err != nil {
		t.Fatal(err)
	}
	if err := GenerateOppai(b); err != nil {
		t.Fatal(err)
	}
	fa, fb := readTree(t, a), readTree(t, b)
	want := []string{"oppai/model.onnx", "oppai/vocabulary.json", "oppai/pr_thresholds.json"}
	if len(fa) != len(want) {
		t.Errorf("generated %d files, want %d: %v", len(fa), len(want), keys(fa))
	}
	for _, name := range want {
		if _, ok := fa[name]; !ok {
			t.Errorf("%s not generated", name)
		} else if !bytes.Equal(fa[name], fb[name]) {
			t.Errorf("%s differs between two runs", name)
		}
	}

	// Regenerating leaves correct files alone.
	p := filepath.Join(a, OppaiDir, ModelFile)
	old := time.Unix(1_000_000, 0)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	if err := GenerateOppai(a); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p); err != nil || !st.ModTime().Equal(old) {
		t.Errorf("model.onnx rewritten although unchanged (%v)", err)
	}

	var vocab struct {
		TagToIndex map[string]int `json:"tag_to_index"`
	}
	if err := json.Unmarshal(fa["oppai/vocabulary.json"], &vocab); err != nil {
		t.Fatal(err)
	}
	tags := OppaiTags()
	if len(vocab.TagToIndex) != len(tags) {
		t.Fatalf("vocabulary has %d entries, want %d", len(vocab.TagToIndex), len(tags))
	}
	for i, name := range tags {
		if got, ok := vocab.TagToIndex[name]; !ok || got != i {
			t.Errorf("tag_to_index[%q] = %d, %v; want %d", name, got, ok, i)
		}
	}
	if vocab.TagToIndex[OppaiPad] != 0 || vocab.TagToIndex[OppaiUnk] != 1 {
		t.Errorf("<PAD>/<UNK> at %d/%d, want 0/1", vocab.TagToIndex[OppaiPad], vocab.TagToIndex[OppaiUnk])
	}
	for _, r := range []string{"general", "sensitive", "questionable", "explicit"} {
		if OppaiTagIndex(OppaiRatingPrefix+r) < 0 {
			t.Errorf("no rating:%s entry", r)
		}
	}

	var thr struct {
		Thresholds map[string]float64 `json:"thresholds"`
	}
	if err := json.Unmarshal(fa["oppai/pr_thresholds.json"], &thr); err != nil {
		t.Fatal(err)
	}
	if len(thr.Thresholds) == 0 || thr.Thresholds["red"] != 0.5 || thr.Thresholds[OppaiStrictTag] != 0.85 {
		t.Errorf("thresholds %v", thr.Thresholds)
	}
	if _, ok := thr.Thresholds["green"]; ok {
		t.Errorf("green should use the fallback, has a threshold")
	}
	for name := range thr.Thresholds {
		if OppaiTagIndex(name) < 0 {
			t.Errorf("threshold for %q, which is not in the vocabulary", name)
		}
	}
}

// checkOppaiColour checks one row of RefOppai for an image of colour want.
func checkOppaiColour(t *testing.T, label string, row []float32, want string) {
	t.Helper()
	for _, c := range Colours {
		s := row[OppaiTagIndex(c.Name)]
		if c.Name == want && s < 0.9 {
			t.Errorf("%s: %s scores %.4f, want >= 0.9", label, c.Name, s)
		}
		if c.Name != want && s >= 0.1 {
			t.Errorf("%s: %s scores %.4f, want < 0.1", label, c.Name, s)
		}
	}
}

func TestRefOppai(t *testing.T) {
	k := len(OppaiTags())
	const hw = OppaiSize * OppaiSize
	for _, c := range Colours {
		// Square: no padding, so no mask and an all-false mask agree.
		px := NCHW(OppaiSize, TaggerNorm, Solid(c.RGB))
		out := RefOppai(px, nil, 1)
		if len(out) != k {
			t.Fatalf("output has %d values, want %d", len(out), k)
		}
		checkOppaiColour(t, c.Name+" square", out, c.Name)
		if same := RefOppai(px, make([]bool, hw), 1); !equalF32(same, out) {
			t.Errorf("%s: all-false mask differs from no mask", c.Name)
		}

		// Letterboxed 300x200 and 120x448: the mask keeps the grey bars out.
		for _, sz := range [][2]int{{300, 200}, {120, 448}} {
			px, mask := oppaiLetterboxed(c.RGB, sz[0], sz[1])
			checkOppaiColour(t, c.Name+" letterboxed", RefOppai(px, mask, 1), c.Name)
		}
	}

	// Without the mask the bars pollute the average: red is lost.
	px, mask := oppaiLetterboxed(red, 300, 200)
	if s := RefOppai(px, nil, 1)[OppaiTagIndex("red")]; s >= 0.1 {
		t.Errorf("unmasked letterboxed red scores %.4f: the mask would not matter", s)
	}

	// A batch is the rows of its items; constant entries are the same for every image.
	px2 := NCHW(OppaiSize, TaggerNorm, Solid(white))
	batch := RefOppai(append(append([]float32{}, px...), px2...), append(append([]bool{}, mask...), make([]bool, hw)...), 2)
	if !equalF32(batch[:k], RefOppai(px, mask, 1)) || !equalF32(batch[k:], RefOppai(px2, nil, 1)) {
		t.Error("batch rows differ from single runs")
	}
	for _, name := range []string{OppaiPad, OppaiUnk, OppaiMidTag, OppaiStrictTag, "rating:general", "rating:explicit"} {
		j := OppaiTagIndex(name)
		if batch[j] != batch[k+j] {
			t.Errorf("%s varies: %v vs %v", name, batch[j], batch[k+j])
		}
	}
	if s := batch[OppaiTagIndex(OppaiPad)]; s < 0.99 {
		t.Errorf("<PAD> scores %.4f, want a high constant", s)
	}
	if s := batch[OppaiTagIndex(OppaiMidTag)]; s >= OppaiFallbackThreshold || s < 0.6 {
		t.Errorf("%s scores %.4f, want in [0.6, fallback)", OppaiMidTag, s)
	}
	if s := batch[OppaiTagIndex(OppaiStrictTag)]; s < OppaiFallbackThreshold || s >= 0.85 {
		t.Errorf("%s scores %.4f, want in [fallback, 0.85)", OppaiStrictTag, s)
	}

	// All padding: finite scores, no division by zero.
	for _, v := range RefOppai(px, allTrue(hw), 1) {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("all-padding mask gives %v", v)
		}
	}
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func allTrue(n int) []bool {
	m := make([]bool, n)
	for i := range m {
		m[i] = true
	}
	return m
}
