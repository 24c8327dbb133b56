package models

import (
	"context"
	"image"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

func oppaiThreshold(v float64) *float64 { return &v }

func TestOppaiFiles(t *testing.T) {
	dir := t.TempDir()
	vp := filepath.Join(dir, "vocabulary.json")
	os.WriteFile(vp, []byte(`{"tag_to_index": {"<PAD>": 0, "<UNK>": 1, "red": 2, "rating:general": 3, "hero": 5, "blue": 6},
		"tag_to_category": {"hero": "character", "blue": 4, "red": "general"}}`), 0o644)
	tags, err := readOppaiVocabulary(vp)
	if err != nil {
		t.Fatal(err)
	}
	want := []oppaiTag{
		{"<PAD>", "<PAD>", oppaiSkip}, {"<UNK>", "<UNK>", oppaiSkip}, {"red", "red", oppaiGeneral},
		{"general", "rating:general", oppaiRating}, {}, {"hero", "hero", oppaiCharacter}, {"blue", "blue", oppaiCharacter},
	}
	if !reflect.DeepEqual(tags, want) {
		t.Fatalf("vocabulary %+v", tags)
	}
	for _, bad := range []string{`{}`, `{"tag_to_index": {"a": -1}}`, `{"tag_to_index": {"a": 0, "b": 0}}`, `{"tag_to_index": {"a": 100000}}`, `not json`} {
		os.WriteFile(vp, []byte(bad), 0o644)
		if _, err := readOppaiVocabulary(vp); err == nil {
			t.Errorf("vocabulary %s accepted", bad)
		}
	}

	tp := filepath.Join(dir, "pr_thresholds.json")
	os.WriteFile(tp, []byte(`{"thresholds": {"red": 0.5, "odd": "x"}}`), 0o644)
	if th, err := readOppaiThresholds(tp); err != nil || !reflect.DeepEqual(th, map[string]float32{"red": 0.5}) {
		t.Fatalf("thresholds %v %v", th, err)
	}
	// The real file holds global statistics only: no per-tag thresholds, no error.
	os.WriteFile(tp, []byte(`{"micro": {"pr_breakeven": {"threshold": 0.79}}, "macro_single_threshold": {}}`), 0o644)
	if th, err := readOppaiThresholds(tp); err != nil || len(th) != 0 {
		t.Fatalf("real-style thresholds %v %v", th, err)
	}
	os.WriteFile(tp, []byte(`{`), 0o644)
	if _, err := readOppaiThresholds(tp); err == nil {
		t.Fatal("corrupt thresholds accepted")
	}
}

func TestOppaiDecode(t *testing.T) {
	o := &oppai{
		tags: []oppaiTag{
			{"<PAD>", "<PAD>", oppaiSkip}, {"<UNK>", "<UNK>", oppaiSkip}, {"red", "red", oppaiGeneral},
			{"blue", "blue", oppaiGeneral}, {"hero", "hero", oppaiCharacter},
			{"general", "rating:general", oppaiRating}, {"explicit", "rating:explicit", oppaiRating},
		},
		thresholds: map[string]float32{"blue": 0.5},
		general:    oppaiFallback, character: oppaiFallback,
	}
	p := []float32{0.99, 0.99, 0.77, 0.6, 0.8, 0.9, 0.01}
	r := o.decode(p, nil)
	if !reflect.DeepEqual(r.General, map[string]float32{"red": 0.77, "blue": 0.6}) ||
		!reflect.DeepEqual(r.Character, map[string]float32{"hero": 0.8}) ||
		!reflect.DeepEqual(r.Rating, map[string]float32{"general": 0.9, "explicit": 0.01}) {
		t.Fatalf("decode: general %v character %v rating %v", r.General, r.Character, r.Rating)
	}
	if r.IPs == nil || len(r.IPs) != 0 || r.IPsMapping == nil {
		t.Fatalf("ips %v mapping %v", r.IPs, r.IPsMapping)
	}
	// A request threshold overrides the per-tag ones; ratings come back regardless.
	r = o.decode(p, &codec.Thresholds{General: oppaiThreshold(0.7), Character: oppaiThreshold(0.85)})
	if !reflect.DeepEqual(r.General, map[string]float32{"red": 0.77}) || len(r.Character) != 0 || len(r.Rating) != 2 {
		t.Fatalf("override: general %v character %v rating %v", r.General, r.Character, r.Rating)
	}
}

// Environment of TestOppaiRuntimeChild.
const (
	oppaiEnvLib  = "ORTBUS_OPPAI_LIB"
	oppaiEnvDir  = "ORTBUS_OPPAI_DIR"
	oppaiEnvRoot = "ORTBUS_OPPAI_ROOT"
)

// oppaiPNGs are the images TestOppaiRuntimeChild tags: name -> (colour, width, height,
// alpha). Each is uniform, so the generated model tags it with its colour name.
var oppaiPNGs = map[string]struct {
	colour string
	w, h   int
	alpha  uint8
}{
	"red_300x200.png":   {"red", 300, 200, 255},   // padded, not scaled
	"green_500x500.png": {"green", 500, 500, 255}, // scaled down, no padding
	"blue_900x300.png":  {"blue", 900, 300, 255},  // scaled down and padded
	"clear_200x400.png": {"white", 200, 400, 0},   // fully transparent: flattened on white
}

// TestOppaiRuntime runs the generated OppaiOracle-style model in ONNX Runtime, each
// version in a child process of its own (one runtime per process).
func TestOppaiRuntime(t *testing.T) {
	models := t.TempDir()
	if err := onnxgen.GenerateOppai(models); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for name, p := range oppaiPNGs {
		rgb := onnxgen.ColourNames[p.colour]
		img := image.NewNRGBA(image.Rect(0, 0, p.w, p.h))
		c := color.NRGBA{rgb[0], rgb[1], rgb[2], p.alpha}
		if p.alpha == 0 {
			c = color.NRGBA{0, 0, 0, 0} // transparent black: must not come out black
		}
		for y := 0; y < p.h; y++ {
			for x := 0; x < p.w; x++ {
				img.SetNRGBA(x, y, c)
			}
		}
		if err := images.WritePNG(filepath.Join(root, name), img); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range testenv.Versions {
		t.Run(v, func(t *testing.T) {
			testenv.RunChild(t, "TestOppaiRuntimeChild",
				oppaiEnvLib+"="+testenv.RuntimeLib(t, v),
				oppaiEnvDir+"="+filepath.Join(models, onnxgen.OppaiDir),
				oppaiEnvRoot+"="+root)
		})
	}
}

func TestOppaiRuntimeChild(t *testing.T) {
	if !testenv.InChild("TestOppaiRuntimeChild") {
		t.Skip("runs only as a child of TestOppaiRuntime")
	}
	rt, err := ort.Load(os.Getenv(oppaiEnvLib))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ONNX Runtime %s", rt.Version)
	root := os.Getenv(oppaiEnvRoot)
	env := Env{Runtime: rt, Images: images.Policy{AllowedRoots: []string{root}}}
	m, err := Open(env, &config.Model{Name: "oppai", Kind: "tagger-oppai", Dir: os.Getenv(oppaiEnvDir)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	o := m.(*oppai)
	if m.Kind() != "tagger-oppai" || !reflect.DeepEqual(m.Ops(), []string{"tag"}) || !m.Batchable("tag") {
		t.Fatalf("kind %s ops %v batchable %v", m.Kind(), m.Ops(), m.Batchable("tag"))
	}
	if o.input != "pixel_values" || o.mask != "padding_mask" || o.output != "tag_logits" || o.size != onnxgen.OppaiSize {
		t.Fatalf("inputs %q %q output %q size %d", o.input, o.mask, o.output, o.size)
	}

	ctx := context.Background()
	names := []string{"red_300x200.png", "green_500x500.png", "blue_900x300.png", "clear_200x400.png"}
	items := make([]Item, len(names))
	for i, name := range names {
		if items[i], err = m.Prepare("tag", &codec.WorkItem{Request: codec.Request{Path: filepath.Join(root, name)}}); err != nil {
			t.Fatalf("prepare %s: %v", name, err)
		}
	}

	// The model in ONNX Runtime against the pure-Go reference, one image at a time and as
	// one batch: square (green) and letterboxed (red, blue, clear) inputs.
	var allPx []float32
	var allMask []bool
	for i, it := range items {
		it := it.(*oppaiItem)
		padded := false
		for _, p := range it.mask {
			padded = padded || p
		}
		if want := oppaiPNGs[names[i]].w != oppaiPNGs[names[i]].h; padded != want {
			t.Errorf("%s: padding in mask %v, want %v", names[i], padded, want)
		}
		got := oppaiRaw(t, o, it.pixels, it.mask, 1)
		oppaiClose(t, names[i], got, onnxgen.RefOppai(it.pixels, it.mask, 1))
		allPx, allMask = append(allPx, it.pixels...), append(allMask, it.mask...)
	}
	oppaiClose(t, "batch", oppaiRaw(t, o, allPx, allMask, len(items)), onnxgen.RefOppai(allPx, allMask, len(items)))

	// Without the mask (all false) the grey bars dilute the red image: not red any more.
	red := items[0].(*oppaiItem)
	if s := oppaiRaw(t, o, red.pixels, make([]bool, len(red.mask)), 1)[onnxgen.OppaiTagIndex("red")]; s >= 0.1 {
		t.Errorf("red 300x200 without its mask scores red %.4f, want < 0.1 (the mask must matter)", s)
	}

	// The model kind end to end: one batched Run.
	replies, errs := m.Run(ctx, "tag", items)
	for i, name := range names {
		if errs[i] != nil {
			t.Fatalf("%s: %v", name, errs[i])
		}
		r := replies[i].(*codec.TagReply)
		want := oppaiPNGs[name].colour
		if s, ok := r.General[want]; !ok || s < 0.9 {
			t.Errorf("%s: not tagged %s (general %v)", name, want, r.General)
		}
		for _, c := range onnxgen.Colours {
			if _, ok := r.General[c.Name]; ok && c.Name != want {
				t.Errorf("%s: also tagged %s (general %v)", name, c.Name, r.General)
			}
		}
		for _, bad := range []string{"<PAD>", "<UNK>", onnxgen.OppaiMidTag, onnxgen.OppaiStrictTag} {
			if _, ok := r.General[bad]; ok {
				t.Errorf("%s: general has %s (%v)", name, bad, r.General)
			}
			if _, ok := r.Rating[bad]; ok {
				t.Errorf("%s: rating has %s", name, bad)
			}
		}
		if len(r.General) != 1 || len(r.Character) != 0 || len(r.IPs) != 0 {
			t.Errorf("%s: general %v character %v ips %v", name, r.General, r.Character, r.IPs)
		}
		for _, rating := range []string{"general", "sensitive", "questionable", "explicit"} {
			if _, ok := r.Rating[rating]; !ok {
				t.Errorf("%s: rating %v lacks %s", name, r.Rating, rating)
			}
		}
		if len(r.Rating) != 4 || r.Rating["general"] < 0.9 || r.Rating["explicit"] > 0.1 {
			t.Errorf("%s: rating %v", name, r.Rating)
		}
	}

	// A lower request threshold keeps the mid-scoring tags (the strict one has its own
	// threshold of 0.85 in pr_thresholds.json, which the request overrides too).
	low, err := m.Prepare("tag", &codec.WorkItem{Request: codec.Request{Path: filepath.Join(root, names[0]),
		Thresholds: &codec.Thresholds{General: oppaiThreshold(0.6)}}})
	if err != nil {
		t.Fatal(err)
	}
	replies, errs = m.Run(ctx, "tag", []Item{low})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	g := replies[0].(*codec.TagReply).General
	if _, ok := g[onnxgen.OppaiMidTag]; !ok {
		t.Errorf("threshold 0.6: %s missing from %v", onnxgen.OppaiMidTag, g)
	}
	if _, ok := g[onnxgen.OppaiStrictTag]; !ok {
		t.Errorf("threshold 0.6: %s missing from %v", onnxgen.OppaiStrictTag, g)
	}
	if _, ok := g["<PAD>"]; ok {
		t.Errorf("threshold 0.6: <PAD> in %v", g)
	}

	// Requests the kind refuses.
	if _, err := m.Prepare("embed", &codec.WorkItem{Request: codec.Request{Path: filepath.Join(root, names[0])}}); codec.CodeOf(err) != codec.CodeUnknownOp {
		t.Errorf("op embed: %v", err)
	}
	outside := filepath.Join(t.TempDir(), "x.png")
	os.WriteFile(outside, []byte("x"), 0o644)
	if _, err := m.Prepare("tag", &codec.WorkItem{Request: codec.Request{Path: outside}}); codec.CodeOf(err) != codec.CodeForbiddenPath {
		t.Errorf("path outside the roots: %v", err)
	}
}

// oppaiRaw runs the model's session directly on n prepared inputs.
func oppaiRaw(t *testing.T, o *oppai, px []float32, mask []bool, n int) []float32 {
	t.Helper()
	sz := int64(o.size)
	outs, err := o.sess.Run(context.Background(), []ort.Tensor{
		{Name: "pixel_values", Shape: []int64{int64(n), 3, sz, sz}, Data: px},
		{Name: "padding_mask", Shape: []int64{int64(n), sz, sz}, Data: mask},
	})
	if err != nil {
		t.Fatal(err)
	}
	return outs[0].Float32()
}

// oppaiClose fails when got and want differ by more than 1e-4 anywhere.
func oppaiClose(t *testing.T, label string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", label, len(got), len(want))
	}
	worst := 0.0
	for i := range got {
		worst = math.Max(worst, math.Abs(float64(got[i])-float64(want[i])))
	}
	if worst > 1e-4 {
		t.Errorf("%s: runtime differs from RefOppai by %g (> 1e-4)", label, worst)
	} else {
		t.Logf("%s: max |runtime - RefOppai| = %.3g", label, worst)
	}
}
