package onnxgen

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
)

// Directory and file names written by Generate, relative to its dir.
const (
	TaggerDir      = "tagger"       // model.onnx, selected_tags.csv, thresholds.csv
	TaggerHeavyDir = "tagger-heavy" // same files; written when Options.TaggerComputeLayers > 0
	CCIPDir        = "ccip"         // model_feat.onnx, model_metrics.onnx, metrics.json
	DetectorDir    = "detector"     // model.onnx
	SegmenterDir   = "isnetis"      // model.onnx
	TinyDir        = "tiny"         // model.onnx
	ScalarDir      = "scalar"       // model.onnx: rank-0 inputs and outputs (ScalarGraph)
	ConstDir       = "const"        // model.onnx: no inputs (ConstGraph)

	ModelFile        = "model.onnx"
	SelectedTagsFile = "selected_tags.csv"
	ThresholdsFile   = "thresholds.csv"
	CCIPFeatFile     = "model_feat.onnx"
	CCIPMetricsFile  = "model_metrics.onnx"
	CCIPMetricsJSON  = "metrics.json"
)

// Options tunes what Generate writes.
type Options struct {
	// TaggerComputeLayers, when > 0, also writes TaggerHeavyDir: the tagger
	// with that many extra 3x3 convolutions (24 channels on a 224x224
	// downscaled copy of the input; ~4 ms per layer and image on one CPU
	// core with ORT 1.30) on a side branch whose result is multiplied by
	// zero and added to the logits. Its outputs equal the plain tagger's;
	// only its compute cost grows, linearly in the layer count, for
	// benchmarks that need real work.
	TaggerComputeLayers int
}

// Heavy-branch shape: the input is average-pooled by heavyPool, then run
// through heavyChannels-wide 3x3 convolutions.
const (
	heavyPool     = 2
	heavyChannels = 24
)

// Generate writes every generated model and its side files under dir,
// creating subdirectories. The output is deterministic: the same Options
// give the same bytes on every run, and a file whose content is already
// right is left untouched (so make-style freshness checks stay quiet).
func Generate(dir string, opt Options) error {
	if opt.TaggerComputeLayers < 0 {
		return fmt.Errorf("onnxgen: TaggerComputeLayers must be >= 0, got %d", opt.TaggerComputeLayers)
	}
	tagCSV, err := selectedTagsCSV()
	if err != nil {
		return fmt.Errorf("onnxgen: selected tags: %w", err)
	}
	thrCSV, err := thresholdsCSV()
	if err != nil {
		return fmt.Errorf("onnxgen: thresholds: %w", err)
	}
	metrics, err := json.Marshal(map[string]float64{"threshold": CCIPThreshold})
	if err != nil {
		return fmt.Errorf("onnxgen: metrics.json: %w", err)
	}

	files := []genFile{
		{filepath.Join(TaggerDir, ModelFile), func() []byte { return TaggerGraph(0).Bytes() }},
		{filepath.Join(TaggerDir, SelectedTagsFile), func() []byte { return tagCSV }},
		{filepath.Join(TaggerDir, ThresholdsFile), func() []byte { return thrCSV }},
		{filepath.Join(CCIPDir, CCIPFeatFile), func() []byte { return CCIPFeatureGraph().Bytes() }},
		{filepath.Join(CCIPDir, CCIPMetricsFile), func() []byte { return CCIPMetricsGraph().Bytes() }},
		{filepath.Join(CCIPDir, CCIPMetricsJSON), func() []byte { return append(metrics, '\n') }},
		{filepath.Join(DetectorDir, ModelFile), func() []byte { return DetectorGraph().Bytes() }},
		{filepath.Join(SegmenterDir, ModelFile), func() []byte { return SegmenterGraph().Bytes() }},
		{filepath.Join(TinyDir, ModelFile), func() []byte { return TinyGraph().Bytes() }},
		{filepath.Join(ScalarDir, ModelFile), func() []byte { return ScalarGraph().Bytes() }},
		{filepath.Join(ConstDir, ModelFile), func() []byte { return ConstGraph().Bytes() }},
	}
	if n := opt.TaggerComputeLayers; n > 0 {
		files = append(files,
			genFile{filepath.Join(TaggerHeavyDir, ModelFile), func() []byte { return TaggerGraph(n).Bytes() }},
			genFile{filepath.Join(TaggerHeavyDir, SelectedTagsFile), func() []byte { return tagCSV }},
			genFile{filepath.Join(TaggerHeavyDir, ThresholdsFile), func() []byte { return thrCSV }},
		)
	}
	for _, f := range files {
		path := filepath.Join(dir, f.path)
		if err := writeIfChanged(path, f.data()); err != nil {
			return fmt.Errorf("onnxgen: generate %s: %w", f.path, err)
		}
	}
	if err := GenerateOppai(dir); err != nil {
		return err
	}
	return nil
}

// genFile is one file Generate writes: its path under dir and its content
// (built only when needed).
type genFile struct {
	path string
	data func() []byte
}

// writeIfChanged writes data to path unless the file already holds exactly
// data.
func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return writeFileAtomic(path, data)
}

// selectedTagsCSV renders TaggerTags as selected_tags.csv
// (id,tag_id,name,category,count,ips; ips a JSON list).
func selectedTagsCSV() ([]byte, error) {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	rows := [][]string{{"id", "tag_id", "name", "category", "count", "ips"}}
	for _, t := range TaggerTags {
		ips := t.IPs
		if ips == nil {
			ips = []string{}
		}
		js, err := json.Marshal(ips)
		if err != nil {
			return nil, fmt.Errorf("tag %q ips: %w", t.Name, err)
		}
		rows = append(rows, []string{
			strconv.Itoa(t.ID), strconv.Itoa(t.TagID), t.Name,
			strconv.Itoa(t.Category), strconv.Itoa(t.Count), string(js),
		})
	}
	if err := w.WriteAll(rows); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// thresholdsCSV renders the per-tag thresholds (category,name,threshold) of
// the tags that have one.
func thresholdsCSV() ([]byte, error) {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	rows := [][]string{{"category", "name", "threshold"}}
	for _, t := range TaggerTags {
		if t.Threshold > 0 {
			rows = append(rows, []string{
				strconv.Itoa(t.Category), t.Name, strconv.FormatFloat(t.Threshold, 'g', -1, 64),
			})
		}
	}
	if err := w.WriteAll(rows); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// TaggerGraph builds the PixAI-style tagger: input "input" float
// [N,3,448,448] (normalised (x/255-0.5)/0.5), output "prediction" float
// [N,K] (sigmoid probabilities, K = len(TaggerTags)).
//
//	cols  = ReduceMean(input, H)                       [N,3,1,448]
//	mean  = ReduceMean(cols, W)                        [N,3,1,1]  f0..f2
//	split = ReduceMean(cols * lrmask[448], W)          [N,3,1,1]  f3..f5
//	feat  = Flatten(Concat(mean, split))               [N,6]
//	prediction = Sigmoid(feat · W + B)
//
// The means are taken in two stages (448 values each) rather than by one
// GlobalAveragePool over 200704 values: ONNX Runtime accumulates that in a
// single float32 sum, which drifted by 3e-5 on CCIP features; two stages
// keep runtimes within ~1e-7 of the references.
//
// With computeLayers > 0 a side branch (AveragePool 2x2 -> computeLayers
// 3x3 Conv+Relu, 24 channels at 224x224 -> GlobalAveragePool -> MatMul by a
// zero [24,K] matrix) is added to the logits: outputs are unchanged, compute
// grows.
func TaggerGraph(computeLayers int) *Graph {
	k := int64(len(TaggerTags))
	g := NewGraph("onnxgen_tagger")
	g.AddInput("input", Float, "N", 3, TaggerSize, TaggerSize)
	g.AddOutput("prediction", Float, "N", int(k))

	mask := g.AddFloat("lr_mask", []int64{TaggerSize}, splitMask())
	w, b := taggerWeights()
	wName := g.AddFloat("head_w", []int64{taggerFeatures, k}, w)
	bName := g.AddFloat("head_b", []int64{k}, b)

	keep := AttrInt("keepdims", 1)
	cols := g.Op("ReduceMean", []string{"input"}, AttrInts("axes", 2), keep)
	mean := g.Op("ReduceMean", []string{cols}, AttrInts("axes", 3), keep)
	split := g.Op("ReduceMean", []string{g.Op("Mul", []string{cols, mask})}, AttrInts("axes", 3), keep)
	feat := g.Op("Flatten", []string{g.Op("Concat", []string{mean, split}, AttrInt("axis", 1))}, AttrInt("axis", 1))
	logits := g.Op("Add", []string{g.Op("MatMul", []string{feat, wName}), bName})

	if computeLayers > 0 {
		side := heavyBranch(g, computeLayers)
		zero := g.AddFloat("heavy_zero", []int64{heavyChannels, k}, make([]float32, heavyChannels*k))
		logits = g.Op("Add", []string{logits, g.Op("MatMul", []string{side, zero})})
	}
	g.AddNode("Sigmoid", []string{logits}, []string{"prediction"})
	return g
}

// heavyBranch adds the compute-only side branch and returns its [N,24]
// output. Weights are He-uniform from a fixed-seed PCG, so activations stay
// finite (a NaN would survive the multiplication by zero).
func heavyBranch(g *Graph, layers int) string {
	rng := rand.NewPCG(0x7a66e4, 0x5eed)
	x := g.Op("AveragePool", []string{"input"},
		AttrInts("kernel_shape", heavyPool, heavyPool), AttrInts("strides", heavyPool, heavyPool))
	cin := int64(3)
	for l := 0; l < layers; l++ {
		cout := int64(heavyChannels)
		fanIn := float64(cin * 9)
		bound := math.Sqrt(6 / fanIn)
		w := make([]float32, cout*cin*9)
		for i := range w {
			w[i] = float32((2*unitFloat(rng) - 1) * bound)
		}
		wName := g.AddFloat(fmt.Sprintf("heavy_w%d", l), []int64{cout, cin, 3, 3}, w)
		bName := g.AddFloat(fmt.Sprintf("heavy_b%d", l), []int64{cout}, make([]float32, cout))
		x = g.Op("Conv", []string{x, wName, bName},
			AttrInts("kernel_shape", 3, 3), AttrInts("pads", 1, 1, 1, 1), AttrInts("strides", 1, 1))
		x = g.Op("Relu", []string{x})
		cin = cout
	}
	return g.Op("Flatten", []string{g.Op("GlobalAveragePool", []string{x})}, AttrInt("axis", 1))
}

// unitFloat returns a float64 in [0,1) from the raw PCG output (the top 53
// bits), independent of math/rand/v2's helper algorithms.
func unitFloat(src *rand.PCG) float64 {
	return float64(src.Uint64()>>11) * 0x1p-53
}

// CCIPFeatureGraph builds the CCIP feature extractor: input "input" float
// [N,3,384,384] (x/255 with CLIP mean/std), output "output" float [N,768].
//
//	p = Flatten(ReduceMean(ReduceMean(input, H), W))   [N,3]
//	output = (p - centre) · W + bias                   [N,768]
//
// centre is each channel's normalised mid-grey and W's rows are orthonormal
// directions scaled by the inverse half range, so a corner colour maps to
// its ±1 sign vector embedded in 768 dimensions (cosine preserved), plus a
// small constant bias direction orthogonal to all three.
func CCIPFeatureGraph() *Graph {
	g := NewGraph("onnxgen_ccip_feat")
	g.AddInput("input", Float, "N", 3, CCIPSize, CCIPSize)
	g.AddOutput("output", Float, "N", CCIPDim)
	centre, w, bias := ccipParams()
	c := g.AddFloat("centre", []int64{3}, centre[:])
	wName := g.AddFloat("embed_w", []int64{3, CCIPDim}, w)
	bName := g.AddFloat("embed_b", []int64{CCIPDim}, bias)
	keep := AttrInt("keepdims", 1)
	p := g.Op("ReduceMean", []string{"input"}, AttrInts("axes", 2), keep) // two stages: see TaggerGraph
	p = g.Op("ReduceMean", []string{p}, AttrInts("axes", 3), keep)
	p = g.Op("Flatten", []string{p}, AttrInt("axis", 1))
	p = g.Op("Sub", []string{p, c})
	g.AddNode("Add", []string{g.Op("MatMul", []string{p, wName}), bName}, []string{"output"})
	return g
}

// CCIPMetricsGraph builds the CCIP metrics model: input "input" float
// [N,768] -> output "output" float [N,N], the pairwise differences
// (1 - cosine)/2 in [0,1], made exactly symmetric ((D+Dᵀ)/2) with an exactly
// zero diagonal (multiplied by 1 - EyeLike).
func CCIPMetricsGraph() *Graph {
	g := NewGraph("onnxgen_ccip_metrics")
	g.AddInput("input", Float, "N", CCIPDim)
	g.AddOutput("output", Float, "N", "N")
	half, one := g.Scalar(0.5), g.Scalar(1)
	norm := g.Op("ReduceL2", []string{"input"}, AttrInts("axes", 1), AttrInt("keepdims", 1))
	norm = g.Op("Max", []string{norm, g.Scalar(ccipEps)})
	xn := g.Op("Div", []string{"input", norm})
	cos := g.Op("MatMul", []string{xn, g.Op("Transpose", []string{xn}, AttrInts("perm", 1, 0))})
	d := g.Op("Mul", []string{g.Op("Sub", []string{one, cos}), half})
	d = g.Op("Mul", []string{g.Op("Add", []string{d, g.Op("Transpose", []string{d}, AttrInts("perm", 1, 0))}), half})
	d = g.Op("Relu", []string{d})
	offDiag := g.Op("Sub", []string{one, g.Op("EyeLike", []string{d})})
	g.AddNode("Mul", []string{d, offDiag}, []string{"output"})
	return g
}

// DetectorGraph builds the YOLOv8-style person detector: input "images"
// float [1,3,640,640] (RGB x/255, letterboxed), output "output0" float
// [1,5,1]: one anchor with cx, cy, w, h (pixels of the 640 input) and the
// person score. It "detects" the bounding box of all saturated-red pixels:
//
//	z     = Conv1x1(images)  = 20*(r - (g+b)/2 - 0.75)       [1,1,640,640]
//	red   = Cast(z > 0); score = ReduceMax(Sigmoid(z) * red)
//	cols  = ReduceMax(red, H); rows = ReduceMax(red, W)
//	x1 = 640 - max(cols * (640-i)); x2 = max(cols * (i+1))   (same for y)
//	box = (x1+x2)/2, (y1+y2)/2, Relu(x2-x1), Relu(y2-y1)
//
// A pixel column i spans [i, i+1), so a rectangle over columns a..b gives
// x1 = a, x2 = b+1. A saturated red pixel scores sigmoid(5) = 0.9933. With
// no red pixel (redness <= 0.75) the score is exactly 0 and w = h = 0.
func DetectorGraph() *Graph {
	g := NewGraph("onnxgen_detector")
	g.AddInput("images", Float, 1, 3, DetectorSize, DetectorSize)
	g.AddOutput("output0", Float, 1, 5, 1)

	cw, cb := detectorConv()
	z := g.Op("Conv", []string{"images",
		g.AddFloat("red_w", []int64{1, 3, 1, 1}, cw[:]),
		g.AddFloat("red_b", []int64{1}, []float32{cb})},
		AttrInts("kernel_shape", 1, 1))
	keep := AttrInt("keepdims", 1)
	red := g.Op("Cast", []string{g.Op("Greater", []string{z, g.Scalar(0)})}, AttrInt("to", int64(Float)))
	score := g.Op("ReduceMax", []string{g.Op("Mul", []string{g.Op("Sigmoid", []string{z}), red})}, keep)
	cols := g.Op("ReduceMax", []string{red}, AttrInts("axes", 2), keep) // [1,1,1,640]
	rows := g.Op("ReduceMax", []string{red}, AttrInts("axes", 3), keep) // [1,1,640,1]

	desc, asc := make([]float32, DetectorSize), make([]float32, DetectorSize)
	for i := range desc {
		desc[i] = float32(DetectorSize - i)
		asc[i] = float32(i + 1)
	}
	size := g.Scalar(DetectorSize)
	descX := g.AddFloat("ramp_desc_x", []int64{DetectorSize}, desc)
	ascX := g.AddFloat("ramp_asc_x", []int64{DetectorSize}, asc)
	descY := g.AddFloat("ramp_desc_y", []int64{DetectorSize, 1}, desc)
	ascY := g.AddFloat("ramp_asc_y", []int64{DetectorSize, 1}, asc)
	maxOf := func(mask, ramp string) string {
		return g.Op("ReduceMax", []string{g.Op("Mul", []string{mask, ramp})}, keep) // [1,1,1,1]
	}
	x1 := g.Op("Sub", []string{size, maxOf(cols, descX)})
	x2 := maxOf(cols, ascX)
	y1 := g.Op("Sub", []string{size, maxOf(rows, descY)})
	y2 := maxOf(rows, ascY)

	half := g.Scalar(0.5)
	cx := g.Op("Mul", []string{g.Op("Add", []string{x1, x2}), half})
	cy := g.Op("Mul", []string{g.Op("Add", []string{y1, y2}), half})
	w := g.Op("Relu", []string{g.Op("Sub", []string{x2, x1})})
	h := g.Op("Relu", []string{g.Op("Sub", []string{y2, y1})})
	all := g.Op("Concat", []string{cx, cy, w, h, score}, AttrInt("axis", 1)) // [1,5,1,1]
	shape := g.AddInt64("out_shape", []int64{3}, []int64{1, 5, 1})
	g.AddNode("Reshape", []string{all, shape}, []string{"output0"})
	return g
}

// SegmenterGraph builds the isnetis-style segmenter: input "img" float
// [1,3,1024,1024] (RGB x/255), output "mask" float [1,1,1024,1024] =
// Sigmoid(50*(0.9 - mean(r,g,b))): ~1 on anything but near-white, 0.0067 on
// white.
func SegmenterGraph() *Graph {
	g := NewGraph("onnxgen_isnetis")
	g.AddInput("img", Float, 1, 3, SegmenterSize, SegmenterSize)
	g.AddOutput("mask", Float, 1, 1, SegmenterSize, SegmenterSize)
	cw, cb := segmenterConv()
	z := g.Op("Conv", []string{"img",
		g.AddFloat("seg_w", []int64{1, 3, 1, 1}, cw[:]),
		g.AddFloat("seg_b", []int64{1}, []float32{cb})},
		AttrInts("kernel_shape", 1, 1))
	g.AddNode("Sigmoid", []string{z}, []string{"mask"})
	return g
}

// TinyGraph builds the smallest useful model, for overhead benchmarks:
// input "x" float [N,4] -> output "y" float [N,4] = x*2 + 1.
func TinyGraph() *Graph {
	g := NewGraph("onnxgen_tiny")
	g.AddInput("x", Float, "N", TinyDim)
	g.AddOutput("y", Float, "N", TinyDim)
	g.AddNode("Add", []string{g.Op("Mul", []string{"x", g.Scalar(tinyMul)}), g.Scalar(tinyAdd)}, []string{"y"})
	return g
}

// ScalarGraph builds a model with rank-0 (scalar) inputs and outputs, for the shapes of
// infer: inputs "x" float [N,3] and "k" float [] (a scalar) ->
//
//	sum   float [] = ReduceSum(x) * k   (every axis; 0 for N = 0)
//	count int64 [] = Size(x)            (3N)
//	y     float [N,3] = x * k
func ScalarGraph() *Graph {
	g := NewGraph("onnxgen_scalar")
	g.AddInput("x", Float, "N", ScalarWidth)
	g.AddInput("k", Float)
	g.AddOutput("sum", Float)
	g.AddOutput("count", Int64)
	g.AddOutput("y", Float, "N", ScalarWidth)
	g.AddNode("Mul", []string{g.Op("ReduceSum", []string{"x"}, AttrInt("keepdims", 0)), "k"}, []string{"sum"})
	g.AddNode("Size", []string{"x"}, []string{"count"})
	g.AddNode("Mul", []string{"x", "k"}, []string{"y"})
	return g
}

// ConstGraph builds a model without inputs, its outputs made by Constant nodes:
// "answer" int64 [] = ConstAnswer, "table" float [2,3] = ConstTable, and "none" float
// [0,2], a zero-size tensor.
func ConstGraph() *Graph {
	g := NewGraph("onnxgen_const")
	g.AddOutput("answer", Int64)
	g.AddOutput("table", Float, 2, 3)
	g.AddOutput("none", Float, 0, 2)
	g.AddNode("Constant", nil, []string{"answer"}, AttrTensor("value", Int64Tensor("answer_value", nil, []int64{ConstAnswer})))
	g.AddNode("Constant", nil, []string{"table"}, AttrTensor("value", FloatTensor("table_value", []int64{2, 3}, ConstTable)))
	g.AddNode("Constant", nil, []string{"none"}, AttrTensor("value", FloatTensor("none_value", []int64{0, 2}, nil)))
	return g
}

// IdentityGraph builds a one-operator model for the element type typ: "x" typ dims ->
// Identity -> "y" typ dims (dims as for AddInput). It is not written by Generate; tests of
// the element types write one per type.
func IdentityGraph(typ DataType, dims ...any) *Graph {
	g := NewGraph(fmt.Sprintf("onnxgen_identity_%d", typ))
	g.AddInput("x", typ, dims...)
	g.AddOutput("y", typ, dims...)
	g.AddNode("Identity", []string{"x"}, []string{"y"})
	return g
}

// CastGraph builds a one-operator model: "x" from dims -> Cast(to) -> "y" to dims. It is
// not written by Generate.
func CastGraph(from, to DataType, dims ...any) *Graph {
	g := NewGraph(fmt.Sprintf("onnxgen_cast_%d_%d", from, to))
	g.AddInput("x", from, dims...)
	g.AddOutput("y", to, dims...)
	g.AddNode("Cast", []string{"x"}, []string{"y"}, AttrInt("to", int64(to)))
	return g
}

// MixedScalarsGraph (named name) has rank-0 float16 and string inputs beside tensors of
// open shape and an int64 scalar: ab = Concat(Unsqueeze(a), b), float16 ["M"]; pq =
// Concat(Unsqueeze(p), q), string ["K"]; k2 = Identity(k), int64 []. onnxruntime_go makes
// no rank-0 value of the first two types: ort rewrites such inputs (scalarin.go).
func MixedScalarsGraph(name string) *Graph {
	g := NewGraph(name)
	g.AddInput("a", Float16)
	g.AddInput("b", Float16, "N")
	g.AddInput("p", String)
	g.AddInput("q", String, "N")
	g.AddInput("k", Int64)
	g.AddOutput("ab", Float16, "M")
	g.AddOutput("pq", String, "K")
	g.AddOutput("k2", Int64)
	axes := g.AddInt64("axes", []int64{1}, []int64{0})
	g.AddNode("Concat", []string{g.Op("Unsqueeze", []string{"a", axes}), "b"}, []string{"ab"}, AttrInt("axis", 0))
	g.AddNode("Concat", []string{g.Op("Unsqueeze", []string{"p", axes}), "q"}, []string{"pq"}, AttrInt("axis", 0))
	g.AddNode("Identity", []string{"k"}, []string{"k2"})
	return g
}

// UnloadableGraph builds a well-formed ONNX file that ONNX Runtime refuses to load: its
// one node is an operator no opset has ("x" float [2] -> NoSuchOp -> "y" float [2]).
// It is not written by Generate; tests write it where they need a model that cannot load.
func UnloadableGraph() *Graph {
	g := NewGraph("onnxgen_unloadable")
	g.AddInput("x", Float, 2)
	g.AddOutput("y", Float, 2)
	g.AddNode("NoSuchOp", []string{"x"}, []string{"y"})
	return g
}

// TripletsGraph builds a model that loads and runs, but not on every input its shape
// allows: "x" float [N,D] -> "y" float [M,3] = Reshape(x, [-1,3]), so D*N must be a
// multiple of 3. A warm-up on zeros (D = 64) fails; x of shape [1,6] gives y [2,3].
// It is not written by Generate.
func TripletsGraph() *Graph {
	g := NewGraph("onnxgen_triplets")
	g.AddInput("x", Float, "N", "D")
	g.AddOutput("y", Float, "M", 3)
	g.AddNode("Reshape", []string{"x", g.AddInt64("triplets", []int64{2}, []int64{-1, 3})}, []string{"y"})
	return g
}

// GenerateTagger writes a tagger with computeLayers extra layers (see TaggerGraph) and its
// label files into dir: a tagger of any cost, for tests and benchmarks that need one
// slower than tagger-heavy.
func GenerateTagger(dir string, computeLayers int) error {
	tagCSV, err := selectedTagsCSV()
	if err != nil {
		return err
	}
	thrCSV, err := thresholdsCSV()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("onnxgen: %w", err)
	}
	for name, data := range map[string][]byte{ModelFile: TaggerGraph(computeLayers).Bytes(), SelectedTagsFile: tagCSV, ThresholdsFile: thrCSV} {
		if err := writeIfChanged(filepath.Join(dir, name), data); err != nil {
			return err
		}
	}
	return nil
}
