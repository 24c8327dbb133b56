package onnxgen

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

var (
	white = [3]uint8{255, 255, 255}
	black = [3]uint8{0, 0, 0}
	grey  = [3]uint8{114, 114, 114} // the letterbox pad colour
	red   = [3]uint8{255, 0, 0}
)

// readTree returns every regular file under dir, keyed by slash path.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		files[filepath.ToSlash(rel)] = data
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestGenerateDeterministic(t *testing.T) {
	opt := Options{TaggerComputeLayers: 2}
	a, b := t.TempDir(), t.TempDir()
	if err := Generate(a, opt); err != nil {
		t.Fatal(err)
	}
	if err := Generate(b, opt); err != nil {
		t.Fatal(err)
	}
	fa, fb := readTree(t, a), readTree(t, b)
	want := []string{
		"tagger/model.onnx", "tagger/selected_tags.csv", "tagger/thresholds.csv",
		"tagger-heavy/model.onnx", "tagger-heavy/selected_tags.csv", "tagger-heavy/thresholds.csv",
		"ccip/model_feat.onnx", "ccip/model_metrics.onnx", "ccip/metrics.json",
		"detector/model.onnx", "isnetis/model.onnx", "tiny/model.onnx",
		"scalar/model.onnx", "const/model.onnx",
		"oppai/model.onnx", "oppai/vocabulary.json", "oppai/pr_thresholds.json",
	}
	if len(fa) != len(want) {
		t.Errorf("generated %d files, want %d: %v", len(fa), len(want), keys(fa))
	}
	for _, name := range want {
		da, ok := fa[name]
		if !ok {
			t.Errorf("%s not generated", name)
			continue
		}
		if !bytes.Equal(da, fb[name]) {
			t.Errorf("%s differs between two runs", name)
		}
	}
	if bytes.Equal(fa["tagger/model.onnx"], fa["tagger-heavy/model.onnx"]) {
		t.Error("heavy tagger is the same model as the plain one")
	}

	// Regenerating over an existing tree leaves files alone, and without
	// compute layers no heavy variant is written.
	st, err := os.Stat(filepath.Join(a, "tiny/model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	if err := Generate(a, opt); err != nil {
		t.Fatal(err)
	}
	st2, err := os.Stat(filepath.Join(a, "tiny/model.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	if !st2.ModTime().Equal(st.ModTime()) {
		t.Error("regenerating rewrote an unchanged file")
	}
	c := t.TempDir()
	if err := Generate(c, Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(c, TaggerHeavyDir)); !os.IsNotExist(err) {
		t.Errorf("heavy tagger written without compute layers (stat: %v)", err)
	}
	if err := Generate(c, Options{TaggerComputeLayers: -1}); err == nil {
		t.Error("negative TaggerComputeLayers accepted")
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestGenerateFailsWithContext(t *testing.T) {
	// A regular file where a directory must go.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, TaggerDir), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := Generate(dir, Options{})
	if err == nil {
		t.Fatal("Generate succeeded with a file in the way")
	}
	if !bytes.Contains([]byte(err.Error()), []byte("tagger/model.onnx")) {
		t.Errorf("error does not name the file: %v", err)
	}
}

func TestSelectedTagsCSV(t *testing.T) {
	data, err := selectedTagsCSV()
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := rows[0]; len(got) != 6 || got[0] != "id" || got[1] != "tag_id" || got[2] != "name" ||
		got[3] != "category" || got[4] != "count" || got[5] != "ips" {
		t.Fatalf("header %v", got)
	}
	if len(rows)-1 != len(TaggerTags) {
		t.Fatalf("%d rows, want %d", len(rows)-1, len(TaggerTags))
	}
	for i, row := range rows[1:] {
		tag := TaggerTags[i]
		if row[0] != strconv.Itoa(i) || row[2] != tag.Name || row[3] != strconv.Itoa(tag.Category) {
			t.Errorf("row %d = %v, want id %d name %s category %d", i, row, i, tag.Name, tag.Category)
		}
		var ips []string
		if err := json.Unmarshal([]byte(row[5]), &ips); err != nil || ips == nil {
			t.Errorf("row %d ips %q is not a JSON list: %v", i, row[5], err)
		}
		if len(ips) != len(tag.IPs) {
			t.Errorf("row %d ips %v, want %v", i, ips, tag.IPs)
		}
	}
	hero := TaggerTags[TaggerTagIndex(TagSplitHero)]
	if hero.Category != CategoryCharacter || len(hero.IPs) == 0 || hero.IPs[0] != "test_franchise" {
		t.Errorf("split_hero = %+v", hero)
	}
	if !bytes.Contains(data, []byte(`"[""test_franchise""]"`)) {
		t.Errorf("ips not written as a quoted JSON list:\n%s", data)
	}
	ratings := 0
	for _, tag := range TaggerTags {
		if tag.Category == CategoryRating {
			ratings++
		}
	}
	if ratings == 0 {
		t.Error("no rating tags")
	}
}

func TestThresholdsCSV(t *testing.T) {
	data, err := thresholdsCSV()
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if h := rows[0]; len(h) != 3 || h[0] != "category" || h[1] != "name" || h[2] != "threshold" {
		t.Fatalf("header %v", h)
	}
	if len(rows) < 2 {
		t.Fatal("no thresholds")
	}
	for _, row := range rows[1:] {
		id := TaggerTagIndex(row[1])
		if id < 0 {
			t.Errorf("threshold for unknown tag %q", row[1])
			continue
		}
		v, err := strconv.ParseFloat(row[2], 64)
		if err != nil || v != TaggerTags[id].Threshold || row[0] != strconv.Itoa(TaggerTags[id].Category) {
			t.Errorf("row %v does not match %+v", row, TaggerTags[id])
		}
	}
}

// protoModel is what the test decoder extracts from a ModelProto.
type protoModel struct {
	irVersion uint64
	opsets    []uint64
	inputs    []string
	outputs   []string
	inits     []string
	nodes     []protoNode
}

type protoNode struct {
	op              string
	inputs, outputs []string
}

// fields splits a message into its fields, failing on malformed bytes.
func fields(t *testing.T, b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, n uint64)) {
	t.Helper()
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			t.Fatalf("bad tag: %v", protowire.ParseError(l))
		}
		b = b[l:]
		switch typ {
		case protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			if l < 0 {
				t.Fatalf("bad varint: %v", protowire.ParseError(l))
			}
			fn(num, typ, nil, v)
			b = b[l:]
		case protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				t.Fatalf("bad bytes: %v", protowire.ParseError(l))
			}
			fn(num, typ, v, 0)
			b = b[l:]
		default:
			l := protowire.ConsumeFieldValue(num, typ, b)
			if l < 0 {
				t.Fatalf("bad field: %v", protowire.ParseError(l))
			}
			b = b[l:]
		}
	}
}

func decodeModel(t *testing.T, b []byte) protoModel {
	t.Helper()
	var m protoModel
	nameOf := func(msg []byte, field protowire.Number) (s string) {
		fields(t, msg, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) {
			if num == field {
				s = string(v)
			}
		})
		return s
	}
	fields(t, b, func(num protowire.Number, _ protowire.Type, v []byte, n uint64) {
		switch num {
		case modelIRVersion:
			m.irVersion = n
		case modelOpsetImport:
			fields(t, v, func(num protowire.Number, _ protowire.Type, _ []byte, n uint64) {
				if num == opsetVersion {
					m.opsets = append(m.opsets, n)
				}
			})
		case modelGraph:
			fields(t, v, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) {
				switch num {
				case graphInput:
					m.inputs = append(m.inputs, nameOf(v, valueName))
				case graphOutput:
					m.outputs = append(m.outputs, nameOf(v, valueName))
				case graphInitializer:
					m.inits = append(m.inits, nameOf(v, tensorName))
				case graphNode:
					var nd protoNode
					fields(t, v, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) {
						switch num {
						case nodeInput:
							nd.inputs = append(nd.inputs, string(v))
						case nodeOutput:
							nd.outputs = append(nd.outputs, string(v))
						case nodeOpType:
							nd.op = string(v)
						}
					})
					m.nodes = append(m.nodes, nd)
				}
			})
		}
	})
	return m
}

// TestModelsWellFormed decodes every generated model and checks the I/O
// names, IR/opset versions, and that the graph is topologically ordered
// with every value defined exactly once.
func TestModelsWellFormed(t *testing.T) {
	one := func(s string) []string { return []string{s} }
	cases := []struct {
		name    string
		g       *Graph
		in, out []string
	}{
		{"tagger", TaggerGraph(0), one("input"), one("prediction")},
		{"tagger-heavy", TaggerGraph(3), one("input"), one("prediction")},
		{"ccip-feat", CCIPFeatureGraph(), one("input"), one("output")},
		{"ccip-metrics", CCIPMetricsGraph(), one("input"), one("output")},
		{"detector", DetectorGraph(), one("images"), one("output0")},
		{"segmenter", SegmenterGraph(), one("img"), one("mask")},
		{"tiny", TinyGraph(), one("x"), one("y")},
		{"scalar", ScalarGraph(), []string{"x", "k"}, []string{"sum", "count", "y"}},
		{"const", ConstGraph(), nil, []string{"answer", "table", "none"}},
		{"unloadable", UnloadableGraph(), one("x"), one("y")},
		{"triplets", TripletsGraph(), one("x"), one("y")},
		{"identity", IdentityGraph(Float16, 2, 3), one("x"), one("y")},
		{"cast", CastGraph(Float, BFloat16, "N"), one("x"), one("y")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := decodeModel(t, c.g.Bytes())
			if m.irVersion != IRVersion || len(m.opsets) != 1 || m.opsets[0] != Opset {
				t.Errorf("ir %d opsets %v", m.irVersion, m.opsets)
			}
			if !slices.Equal(m.inputs, c.in) || !slices.Equal(m.outputs, c.out) {
				t.Errorf("inputs %v outputs %v, want %v %v", m.inputs, m.outputs, c.in, c.out)
			}
			defined := map[string]bool{}
			define := func(name string) {
				if defined[name] {
					t.Errorf("%q defined twice", name)
				}
				defined[name] = true
			}
			for _, n := range m.inputs {
				define(n)
			}
			for _, n := range m.inits {
				define(n)
			}
			for _, nd := range m.nodes {
				if nd.op == "" {
					t.Error("node without op_type")
				}
				for _, in := range nd.inputs {
					if !defined[in] {
						t.Errorf("%s reads %q before it is defined", nd.op, in)
					}
				}
				for _, out := range nd.outputs {
					define(out)
				}
			}
			for _, out := range m.outputs {
				if !defined[out] {
					t.Errorf("output %q is never produced", out)
				}
			}
		})
	}
}

func TestGraphPanicsOnBadShapes(t *testing.T) {
	mustPanic := func(name string, fn func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		fn()
	}
	g := NewGraph("bad")
	mustPanic("dims type", func() { g.AddInput("x", Float, 1.5) })
	mustPanic("float count", func() { g.AddFloat("w", []int64{2, 3}, make([]float32, 5)) })
	mustPanic("int64 count", func() { g.AddInt64("s", []int64{2}, []int64{1}) })
}

func TestRefTaggerColoursAndPatterns(t *testing.T) {
	var imgs []PixelFunc
	for _, c := range Colours {
		imgs = append(imgs, Solid(c.RGB))
	}
	split := len(imgs)
	imgs = append(imgs, Split(white, black, TaggerSize), Split(black, white, TaggerSize))
	n := len(imgs)
	out := RefTagger(NCHW(TaggerSize, TaggerNorm, imgs...), n)
	k := len(TaggerTags)
	if len(out) != n*k {
		t.Fatalf("output has %d values, want %d", len(out), n*k)
	}
	heroID, mirrorID := TaggerTagIndex(TagSplitHero), TaggerTagIndex(TagMirrorHero)
	for i, c := range Colours {
		row := out[i*k : (i+1)*k]
		for j, other := range Colours {
			s := row[TaggerTagIndex(other.Name)]
			if j == i && s < 0.9 {
				t.Errorf("%s image: %s scores %.4f, want >= 0.9", c.Name, other.Name, s)
			}
			if j != i && s >= 0.1 {
				t.Errorf("%s image: %s scores %.4f, want < 0.1", c.Name, other.Name, s)
			}
		}
		for _, id := range []int{heroID, mirrorID} {
			if row[id] >= 0.1 {
				t.Errorf("%s image: character %s scores %.4f, want < 0.1", c.Name, TaggerTags[id].Name, row[id])
			}
		}
	}
	for p, id := range []int{heroID, mirrorID} {
		row := out[(split+p)*k : (split+p+1)*k]
		if row[id] < 0.9 {
			t.Errorf("pattern %d: %s scores %.4f, want >= 0.9", p, TaggerTags[id].Name, row[id])
		}
		for _, other := range []int{heroID, mirrorID} {
			if other != id && row[other] >= 0.1 {
				t.Errorf("pattern %d: %s scores %.4f, want < 0.1", p, TaggerTags[other].Name, row[other])
			}
		}
		for _, c := range Colours {
			if s := row[TaggerTagIndex(c.Name)]; s >= 0.1 {
				t.Errorf("pattern %d: colour %s scores %.4f, want < 0.1", p, c.Name, s)
			}
		}
	}
	// Ratings are constant: the same score for every image.
	for id, tag := range TaggerTags {
		if tag.Category != CategoryRating {
			continue
		}
		for i := 1; i < n; i++ {
			if out[i*k+id] != out[id] {
				t.Errorf("rating %s varies: %v vs %v", tag.Name, out[i*k+id], out[id])
			}
		}
	}
}

func TestRefCCIP(t *testing.T) {
	var imgs []PixelFunc
	for _, c := range Colours {
		imgs = append(imgs, Solid(c.RGB))
	}
	n := len(imgs)
	feat := RefCCIPFeature(NCHW(CCIPSize, CCIPNorm, imgs...), n)
	if len(feat) != n*CCIPDim {
		t.Fatalf("features have %d values, want %d", len(feat), n*CCIPDim)
	}
	// Each colour twice: [f0..f7, f0..f7].
	both := append(append([]float32(nil), feat...), feat...)
	m := 2 * n
	diff := RefCCIPMetrics(both, m)
	for i := 0; i < m; i++ {
		for j := 0; j < m; j++ {
			d := diff[i*m+j]
			if d != diff[j*m+i] {
				t.Errorf("not symmetric at %d,%d", i, j)
			}
			if i == j && d != 0 {
				t.Errorf("diagonal %d = %v", i, d)
			}
			same := i%n == j%n
			if same && d > CCIPThreshold {
				t.Errorf("%s vs %s: difference %.4f > threshold", Colours[i%n].Name, Colours[j%n].Name, d)
			}
			if !same && d <= CCIPThreshold {
				t.Errorf("%s vs %s: difference %.4f <= threshold", Colours[i%n].Name, Colours[j%n].Name, d)
			}
		}
	}
	if d := CCIPDifference(feat[:CCIPDim], feat[2*CCIPDim:3*CCIPDim]); d != diff[2] {
		t.Errorf("CCIPDifference = %v, metrics say %v", d, diff[2])
	}
	// A mid-grey image (feature ~ the bias alone) still has a finite,
	// non-degenerate difference from itself and from the corners.
	g := RefCCIPFeature(NCHW(CCIPSize, CCIPNorm, Solid([3]uint8{128, 128, 128})), 1)
	if d := CCIPDifference(g, g); d > 1e-6 {
		t.Errorf("grey vs grey = %v", d)
	}
	if d := CCIPDifference(g, feat[:CCIPDim]); math.IsNaN(float64(d)) || d <= 0 {
		t.Errorf("grey vs black = %v", d)
	}
}

func TestCCIPParamsOrthonormal(t *testing.T) {
	centre, w, bias := ccipParams()
	rows := [][]float64{}
	for ch := 0; ch < 3; ch++ {
		half := 0.5 / float64(ccipStd[ch])
		r := make([]float64, CCIPDim)
		for j := range r {
			r[j] = float64(w[ch*CCIPDim+j]) * half
		}
		rows = append(rows, r)
		mid := (0.5 - float64(ccipMean[ch])) / float64(ccipStd[ch])
		if math.Abs(float64(centre[ch])-mid) > 1e-6 {
			t.Errorf("centre[%d] = %v, want %v", ch, centre[ch], mid)
		}
	}
	b := make([]float64, CCIPDim)
	for j := range b {
		b[j] = float64(bias[j]) / ccipBiasNorm
	}
	rows = append(rows, b)
	for i := range rows {
		for j := range rows {
			var dot float64
			for d := range rows[i] {
				dot += rows[i][d] * rows[j][d]
			}
			want := 0.0
			if i == j {
				want = 1
			}
			if math.Abs(dot-want) > 1e-5 {
				t.Errorf("row %d · row %d = %v, want %v", i, j, dot, want)
			}
		}
	}
}

func TestRefDetector(t *testing.T) {
	for _, bg := range [][3]uint8{white, grey} {
		x1, y1, x2, y2 := 100, 150, 300, 500
		out := RefDetector(NCHW(DetectorSize, UnitNorm, Rect(bg, red, x1, y1, x2, y2)))
		if len(out) != 5 {
			t.Fatalf("output has %d values, want 5", len(out))
		}
		bx1, by1, bx2, by2, score := DetectorBox(out)
		if score < 0.9 {
			t.Errorf("bg %v: score %.4f, want >= 0.9", bg, score)
		}
		for _, p := range [][2]float32{{bx1, float32(x1)}, {by1, float32(y1)}, {bx2, float32(x2)}, {by2, float32(y2)}} {
			if math.Abs(float64(p[0]-p[1])) > 0.5 {
				t.Errorf("bg %v: box %v,%v,%v,%v, want %d,%d,%d,%d", bg, bx1, by1, bx2, by2, x1, y1, x2, y2)
				break
			}
		}
	}
	for _, c := range append([]Colour{{"grey", grey}}, Colours...) {
		if c.Name == "red" {
			continue
		}
		out := RefDetector(NCHW(DetectorSize, UnitNorm, Solid(c.RGB)))
		if out[4] >= DetectorConf {
			t.Errorf("uniform %s: score %.4f, want < %v", c.Name, out[4], DetectorConf)
		}
	}
}

func TestRefSegmenter(t *testing.T) {
	x1, y1, x2, y2 := 200, 300, 600, 900
	out := RefSegmenter(NCHW(SegmenterSize, UnitNorm, Rect(white, black, x1, y1, x2, y2)))
	if len(out) != SegmenterSize*SegmenterSize {
		t.Fatalf("mask has %d values", len(out))
	}
	for y := 0; y < SegmenterSize; y += 7 {
		for x := 0; x < SegmenterSize; x += 7 {
			v := out[y*SegmenterSize+x]
			inside := x >= x1 && x < x2 && y >= y1 && y < y2
			if inside && v < 0.99 || !inside && v > 0.01 {
				t.Fatalf("mask(%d,%d) = %v (inside %v)", x, y, v, inside)
			}
		}
	}
}

func TestRefTiny(t *testing.T) {
	in := []float32{0, 1, -2, 3.5, 10, -0.25, 7, 8}
	out := RefTiny(in)
	for i, v := range in {
		if out[i] != v*2+1 {
			t.Errorf("y[%d] = %v, want %v", i, out[i], v*2+1)
		}
	}
}

// TestValueShapes: an output declared with no dimensions is rank 0 (a TensorShapeProto
// without dims), one added by AddOutputNoShape has no TensorShapeProto at all.
func TestValueShapes(t *testing.T) {
	g := NewGraph("shapes")
	g.AddInput("x", Float, 2)
	g.AddOutput("scalar", Float)
	g.AddOutputNoShape("unknown", Float)
	g.AddNode("ReduceSum", []string{"x"}, []string{"scalar"}, AttrInt("keepdims", 0))
	g.AddNode("Identity", []string{"x"}, []string{"unknown"})
	hasShape := map[string]bool{}
	fields(t, g.Bytes(), func(num protowire.Number, _ protowire.Type, graph []byte, _ uint64) {
		if num != modelGraph {
			return
		}
		fields(t, graph, func(num protowire.Number, _ protowire.Type, vi []byte, _ uint64) {
			if num != graphOutput {
				return
			}
			var name string
			shape := false
			fields(t, vi, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) {
				switch num {
				case valueName:
					name = string(v)
				case valueType:
					fields(t, v, func(num protowire.Number, _ protowire.Type, tt []byte, _ uint64) {
						fields(t, tt, func(num protowire.Number, _ protowire.Type, sh []byte, _ uint64) {
							if num == tensorShape {
								shape = true
								if len(sh) != 0 {
									t.Errorf("%s: shape has dimensions", name)
								}
							}
						})
					})
				}
			})
			hasShape[name] = shape
		})
	})
	if !hasShape["scalar"] || hasShape["unknown"] || len(hasShape) != 2 {
		t.Errorf("outputs with a shape: %v, want scalar alone", hasShape)
	}
}

func TestRefScalar(t *testing.T) {
	sum, count, y := RefScalar([]float32{1, 2, 3, 4, 5, 6}, 0.5)
	if sum != 10.5 || count != 6 || !slices.Equal(y, []float32{0.5, 1, 1.5, 2, 2.5, 3}) {
		t.Errorf("RefScalar = %v %v %v", sum, count, y)
	}
	if sum, count, y := RefScalar(nil, 2); sum != 0 || count != 0 || len(y) != 0 {
		t.Errorf("RefScalar of no rows = %v %v %v", sum, count, y)
	}
}
