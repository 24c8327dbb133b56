package ort_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

// One runtime per process: every test that loads a runtime runs in a child process
// (testenv.Child). TestRuntimes is the parent; TestRuntimeChild does the work there and
// does nothing when run directly. The library-finding tests load nothing and run in the
// parent process.

// Environment of a TestRuntimeChild process.
const (
	envVersion = "ORTBUS_TEST_ORT_VERSION" // the version asked for
	envLib     = "ORTBUS_TEST_ORT_LIB"     // that version's library
	envOther   = "ORTBUS_TEST_ORT_OTHER"   // another version's library, for the one-runtime check
)

const childTest = "TestRuntimeChild"

// tol is the largest difference allowed between a runtime's output and onnxgen's
// reference (the references agree to ~2e-6).
const tol = 1e-4

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m)) }

// TestRuntimes runs TestRuntimeChild once per supported runtime version, each in a
// process of its own.
func TestRuntimes(t *testing.T) {
	testenv.Models(t) // generated once here, reused by the children
	libs := map[string]string{}
	for _, v := range testenv.Versions {
		libs[v] = testenv.RuntimeLib(t, v)
	}
	for i, v := range testenv.Versions {
		other := testenv.Versions[(i+1)%len(testenv.Versions)]
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			testenv.RunChild(t, childTest,
				envVersion+"="+v, envLib+"="+libs[v], envOther+"="+libs[other])
		})
	}
}

// TestRuntimeChild is the body of TestRuntimes, run in a child process with one runtime.
func TestRuntimeChild(t *testing.T) {
	if !testenv.InChild(childTest) {
		t.Skip("runs only as a child process of TestRuntimes")
	}
	version, lib, other := os.Getenv(envVersion), os.Getenv(envLib), os.Getenv(envOther)
	if version == "" || lib == "" {
		t.Fatalf("child started without %s / %s", envVersion, envLib)
	}
	models := testenv.Models(t)

	// Load through a Spec naming the runtime's prefix, as a pool config does: Find must
	// look in PREFIX/lib.
	prefix := filepath.Dir(filepath.Dir(lib))
	rt, err := ort.LoadSpec(ort.Spec{Dirs: []string{prefix}})
	if err != nil {
		t.Fatalf("LoadSpec(%s): %v", prefix, err)
	}
	if rt.Path != lib {
		t.Errorf("runtime path = %q, want %q", rt.Path, lib)
	}
	if rt.Version != version {
		t.Fatalf("runtime version = %q, want %q", rt.Version, version)
	}
	t.Logf("ONNX Runtime %s from %s", rt.Version, rt.Path)

	c := &child{rt: rt, models: models}
	t.Run("Tagger", c.testTagger)
	t.Run("TaggerHeavy", c.testTaggerHeavy)
	t.Run("CCIP", c.testCCIP)
	t.Run("Detector", c.testDetector)
	t.Run("Segmenter", c.testSegmenter)
	t.Run("Tiny", c.testTiny)
	t.Run("ScalarInput", c.testScalarInput)
	t.Run("ScalarModel", c.testScalarModel)
	t.Run("ConstModel", c.testConstModel)
	t.Run("UnknownRank", c.testUnknownRank)
	t.Run("ElementTypes", c.testElementTypes)
	t.Run("Strings", c.testStrings)
	t.Run("HalfOpenShape", c.testHalfOpenShape)
	t.Run("ScalarInputs", c.testScalarInputs)
	t.Run("UnreturnableOutput", c.testUnreturnableOutput)
	t.Run("Unloadable", c.testUnloadable)
	t.Run("ProbeChain", c.testProbeChain)
	t.Run("Concurrent", c.testConcurrent)
	t.Run("SessionsCreated", c.testSessionsCreated)
	t.Run("MissingInput", c.testMissingInput)
	t.Run("CancelledBeforeRun", c.testCancelledBeforeRun)
	t.Run("CancelMidRun", c.testCancelMidRun)
	t.Run("Providers", c.testProviders)
	t.Run("OneRuntimePerProcess", func(t *testing.T) { c.testOneRuntime(t, other) })
}

type child struct {
	rt     *ort.Runtime
	models string
}

func (c *child) model(parts ...string) string {
	return filepath.Join(append([]string{c.models}, parts...)...)
}

func (c *child) session(t *testing.T, path string, cfg ort.SessionConfig) *ort.Session {
	t.Helper()
	s, err := c.rt.NewSession(path, cfg)
	if err != nil {
		t.Fatalf("NewSession(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close(%s): %v", path, err)
		}
	})
	return s
}

// run runs s on one float32 input and returns its single float32 output.
func run(t *testing.T, s *ort.Session, input string, shape []int64, data []float32) ([]float32, []int64) {
	t.Helper()
	outs, err := s.Run(context.Background(), []ort.Tensor{{Name: input, Shape: shape, Data: data}})
	if err != nil {
		t.Fatalf("Run(%s): %v", filepath.Base(filepath.Dir(s.Path)), err)
	}
	if len(outs) != 1 {
		t.Fatalf("Run returned %d outputs, want 1", len(outs))
	}
	got := outs[0].Float32()
	if got == nil {
		t.Fatalf("output %q is %T, want []float32", outs[0].Name, outs[0].Data)
	}
	return got, outs[0].Shape
}

// near fails t when got and want differ in length or by more than tol anywhere.
func near(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst, at := 0.0, -1
	for i := range got {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		if d > worst || at < 0 {
			worst, at = d, i
		}
	}
	if worst > tol {
		t.Errorf("%s: max |runtime - reference| = %g at %d (runtime %g, reference %g), want <= %g",
			what, worst, at, got[at], want[at], tol)
	}
}

func wantShape(t *testing.T, what string, got, want []int64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s shape = %v, want %v", what, got, want)
	}
}

func wantIO(t *testing.T, s *ort.Session, ins, outs []ort.IOInfo) {
	t.Helper()
	if !reflect.DeepEqual(s.Inputs, ins) {
		t.Errorf("inputs = %+v, want %+v", s.Inputs, ins)
	}
	if !reflect.DeepEqual(s.Outputs, outs) {
		t.Errorf("outputs = %+v, want %+v", s.Outputs, outs)
	}
}

// taggerImages are the eight corner colours (in tag-id order), then the split and the
// mirrored split pattern.
func taggerImages() []onnxgen.PixelFunc {
	var imgs []onnxgen.PixelFunc
	for _, col := range onnxgen.Colours {
		imgs = append(imgs, onnxgen.Solid(col.RGB))
	}
	white, black := onnxgen.ColourNames["white"], onnxgen.ColourNames["black"]
	return append(imgs,
		onnxgen.Split(white, black, onnxgen.TaggerSize),
		onnxgen.Split(black, white, onnxgen.TaggerSize))
}

func (c *child) testTagger(t *testing.T) {
	s := c.session(t, c.model(onnxgen.TaggerDir, onnxgen.ModelFile), ort.SessionConfig{})
	k := len(onnxgen.TaggerTags)
	wantIO(t, s,
		[]ort.IOInfo{{Name: "input", Shape: []int64{-1, 3, onnxgen.TaggerSize, onnxgen.TaggerSize}, Type: "float32"}},
		[]ort.IOInfo{{Name: "prediction", Shape: []int64{-1, int64(k)}, Type: "float32"}})

	imgs := taggerImages()
	n := len(imgs)
	in := onnxgen.NCHW(onnxgen.TaggerSize, onnxgen.TaggerNorm, imgs...)
	got, shape := run(t, s, "input", []int64{int64(n), 3, onnxgen.TaggerSize, onnxgen.TaggerSize}, in)
	wantShape(t, "prediction", shape, []int64{int64(n), int64(k)})
	near(t, "prediction", got, onnxgen.RefTagger(in, n))
	if len(got) != n*k {
		return
	}

	split := onnxgen.TaggerTagIndex(onnxgen.TagSplitHero)
	mirror := onnxgen.TaggerTagIndex(onnxgen.TagMirrorHero)
	for i, col := range onnxgen.Colours {
		row := got[i*k : (i+1)*k]
		for j, other := range onnxgen.Colours {
			switch p := row[j]; {
			case i == j && p < 0.9:
				t.Errorf("%s image: %s = %.4f, want >= 0.9", col.Name, other.Name, p)
			case i != j && p >= 0.1:
				t.Errorf("%s image: %s = %.4f, want < 0.1", col.Name, other.Name, p)
			}
		}
		for _, j := range []int{split, mirror} {
			if row[j] >= 0.1 {
				t.Errorf("%s image: %s = %.4f, want < 0.1", col.Name, onnxgen.TaggerTags[j].Name, row[j])
			}
		}
	}
	for i, want := range map[int]int{8: split, 9: mirror} {
		row := got[i*k : (i+1)*k]
		for _, j := range []int{split, mirror} {
			if p := row[j]; (j == want) != (p >= 0.9) || (j != want && p >= 0.1) {
				t.Errorf("%s pattern: %s = %.4f", onnxgen.TaggerTags[want].Name, onnxgen.TaggerTags[j].Name, p)
			}
		}
	}
}

func (c *child) testTaggerHeavy(t *testing.T) {
	s := c.session(t, c.model(onnxgen.TaggerHeavyDir, onnxgen.ModelFile), ort.SessionConfig{})
	white, black := onnxgen.ColourNames["white"], onnxgen.ColourNames["black"]
	imgs := []onnxgen.PixelFunc{
		onnxgen.Solid(onnxgen.ColourNames["cyan"]),
		onnxgen.Split(white, black, onnxgen.TaggerSize),
	}
	in := onnxgen.NCHW(onnxgen.TaggerSize, onnxgen.TaggerNorm, imgs...)
	got, _ := run(t, s, "input", []int64{2, 3, onnxgen.TaggerSize, onnxgen.TaggerSize}, in)
	near(t, "heavy prediction", got, onnxgen.RefTagger(in, 2))
	k := len(onnxgen.TaggerTags)
	if len(got) == 2*k {
		if p := got[onnxgen.TaggerTagIndex("cyan")]; p < 0.9 {
			t.Errorf("cyan image: cyan = %.4f, want >= 0.9", p)
		}
		if p := got[k+onnxgen.TaggerTagIndex(onnxgen.TagSplitHero)]; p < 0.9 {
			t.Errorf("split image: %s = %.4f, want >= 0.9", onnxgen.TagSplitHero, p)
		}
	}
}

func (c *child) testCCIP(t *testing.T) {
	feat := c.session(t, c.model(onnxgen.CCIPDir, onnxgen.CCIPFeatFile), ort.SessionConfig{})
	metrics := c.session(t, c.model(onnxgen.CCIPDir, onnxgen.CCIPMetricsFile), ort.SessionConfig{})
	wantIO(t, metrics,
		[]ort.IOInfo{{Name: "input", Shape: []int64{-1, onnxgen.CCIPDim}, Type: "float32"}},
		[]ort.IOInfo{{Name: "output", Shape: []int64{-1, -1}, Type: "float32"}})

	// The eight corners, then red again: image 8 is the same character as image 2.
	var imgs []onnxgen.PixelFunc
	for _, col := range onnxgen.Colours {
		imgs = append(imgs, onnxgen.Solid(col.RGB))
	}
	imgs = append(imgs, onnxgen.Solid(onnxgen.ColourNames["red"]))
	n := len(imgs)
	in := onnxgen.NCHW(onnxgen.CCIPSize, onnxgen.CCIPNorm, imgs...)
	f, shape := run(t, feat, "input", []int64{int64(n), 3, onnxgen.CCIPSize, onnxgen.CCIPSize}, in)
	wantShape(t, "feature", shape, []int64{int64(n), onnxgen.CCIPDim})
	near(t, "feature", f, onnxgen.RefCCIPFeature(in, n))
	if len(f) != n*onnxgen.CCIPDim {
		return
	}

	d, shape := run(t, metrics, "input", []int64{int64(n), onnxgen.CCIPDim}, f)
	wantShape(t, "differences", shape, []int64{int64(n), int64(n)})
	near(t, "differences", d, onnxgen.RefCCIPMetrics(f, n))
	if len(d) != n*n {
		return
	}
	name := func(i int) string { return fmt.Sprintf("%s#%d", onnxgen.Colours[i%len(onnxgen.Colours)].Name, i) }
	same := func(i, j int) bool { return i == j || (i == 2 && j == 8) || (i == 8 && j == 2) }
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			diff := float64(d[i*n+j])
			if same(i, j) && diff > onnxgen.CCIPThreshold {
				t.Errorf("%s vs %s: difference %.4f > threshold %.4f (same colour)", name(i), name(j), diff, onnxgen.CCIPThreshold)
			}
			if !same(i, j) && diff <= onnxgen.CCIPThreshold {
				t.Errorf("%s vs %s: difference %.4f <= threshold %.4f (different colours)", name(i), name(j), diff, onnxgen.CCIPThreshold)
			}
		}
	}
}

func (c *child) testDetector(t *testing.T) {
	s := c.session(t, c.model(onnxgen.DetectorDir, onnxgen.ModelFile), ort.SessionConfig{})
	wantIO(t, s,
		[]ort.IOInfo{{Name: "images", Shape: []int64{1, 3, onnxgen.DetectorSize, onnxgen.DetectorSize}, Type: "float32"}},
		[]ort.IOInfo{{Name: "output0", Shape: []int64{1, 5, 1}, Type: "float32"}})
	shape := []int64{1, 3, onnxgen.DetectorSize, onnxgen.DetectorSize}
	white, red := onnxgen.ColourNames["white"], onnxgen.ColourNames["red"]

	in := onnxgen.NCHW(onnxgen.DetectorSize, onnxgen.UnitNorm, onnxgen.Rect(white, red, 100, 150, 300, 420))
	got, oshape := run(t, s, "images", shape, in)
	wantShape(t, "output0", oshape, []int64{1, 5, 1})
	near(t, "red rectangle", got, onnxgen.RefDetector(in))
	if len(got) == 5 {
		x1, y1, x2, y2, score := onnxgen.DetectorBox(got)
		if x1 != 100 || y1 != 150 || x2 != 300 || y2 != 420 {
			t.Errorf("box = (%g,%g)-(%g,%g), want (100,150)-(300,420)", x1, y1, x2, y2)
		}
		if score < 0.99 {
			t.Errorf("score = %.4f, want >= 0.99", score)
		}
	}

	in = onnxgen.NCHW(onnxgen.DetectorSize, onnxgen.UnitNorm, onnxgen.Solid(onnxgen.ColourNames["yellow"]))
	got, _ = run(t, s, "images", shape, in)
	near(t, "no red", got, onnxgen.RefDetector(in))
	if len(got) == 5 && (got[4] != 0 || got[2] != 0 || got[3] != 0) {
		t.Errorf("image without red: w=%g h=%g score=%g, want 0 0 0", got[2], got[3], got[4])
	}
}

func (c *child) testSegmenter(t *testing.T) {
	s := c.session(t, c.model(onnxgen.SegmenterDir, onnxgen.ModelFile), ort.SessionConfig{})
	const size = onnxgen.SegmenterSize
	in := onnxgen.NCHW(size, onnxgen.UnitNorm,
		onnxgen.Rect(onnxgen.ColourNames["white"], onnxgen.ColourNames["blue"], 200, 300, 700, 800))
	got, shape := run(t, s, "img", []int64{1, 3, size, size}, in)
	wantShape(t, "mask", shape, []int64{1, 1, size, size})
	near(t, "mask", got, onnxgen.RefSegmenter(in))
	if len(got) != size*size {
		return
	}
	if fg := got[500*size+400]; fg < 0.99 {
		t.Errorf("mask inside the rectangle = %.4f, want >= 0.99", fg)
	}
	if bg := got[10*size+10]; bg > 0.01 {
		t.Errorf("mask on white = %.4f, want <= 0.01", bg)
	}
}

func tinyInput(n, seed int) []float32 {
	x := make([]float32, n*onnxgen.TinyDim)
	for i := range x {
		x[i] = float32(seed*1000+i) / 8
	}
	return x
}

func (c *child) testTiny(t *testing.T) {
	s := c.session(t, c.model(onnxgen.TinyDir, onnxgen.ModelFile), ort.SessionConfig{IntraOpThreads: 1, InterOpThreads: 1})
	wantIO(t, s,
		[]ort.IOInfo{{Name: "x", Shape: []int64{-1, onnxgen.TinyDim}, Type: "float32"}},
		[]ort.IOInfo{{Name: "y", Shape: []int64{-1, onnxgen.TinyDim}, Type: "float32"}})
	if s.EP != "cpu" {
		t.Errorf("EP = %q, want cpu (the default)", s.EP)
	}
	x := []float32{0, 1, -1, 0.5, 3, -2.25, 100, 1e-3, 7, 8, 9, 10}
	got, shape := run(t, s, "x", []int64{3, onnxgen.TinyDim}, x)
	wantShape(t, "y", shape, []int64{3, onnxgen.TinyDim})
	near(t, "y", got, onnxgen.RefTiny(x))
}

// testScalarInput runs a model with a rank-0 input (an int64 scalar, as Silero VAD's
// sample rate "sr" is declared): a tensor of shape [] with one element goes in as a
// scalar, y = x * float(k).
func (c *child) testScalarInput(t *testing.T) {
	g := onnxgen.NewGraph("scalar_input")
	g.AddInput("x", onnxgen.Float, "N", 2)
	g.AddInput("k", onnxgen.Int64)
	g.AddOutput("y", onnxgen.Float, "N", 2)
	g.AddNode("Mul", []string{"x", g.Op("Cast", []string{"k"}, onnxgen.AttrInt("to", int64(onnxgen.Float)))}, []string{"y"})
	path := filepath.Join(t.TempDir(), "scalar.onnx")
	if err := g.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	s := c.session(t, path, ort.SessionConfig{IntraOpThreads: 1})
	wantIO(t, s,
		[]ort.IOInfo{{Name: "x", Shape: []int64{-1, 2}, Type: "float32"}, {Name: "k", Type: "int64"}},
		[]ort.IOInfo{{Name: "y", Shape: []int64{-1, 2}, Type: "float32"}})
	for _, shape := range [][]int64{nil, {}} {
		outs, err := s.Run(context.Background(), []ort.Tensor{{Name: "x", Shape: []int64{1, 2}, Data: []float32{1.5, -2}}, {Name: "k", Shape: shape, Data: []int64{3}}})
		if err != nil {
			t.Fatalf("Run with k of shape %#v: %v", shape, err)
		}
		near(t, "y", outs[0].Float32(), []float32{4.5, -6})
	}
	// A scalar holds exactly one element.
	if _, err := s.Run(context.Background(), []ort.Tensor{{Name: "x", Shape: []int64{1, 2}, Data: []float32{1, 2}}, {Name: "k", Data: []int64{}}}); err == nil {
		t.Error("Run with a scalar of no element: no error")
	}
}

// outputsByName runs s on ins and returns its outputs by name, failing t on an error.
func outputsByName(t *testing.T, s *ort.Session, ins []ort.Tensor) map[string]ort.Tensor {
	t.Helper()
	outs, err := s.Run(context.Background(), ins)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	m := map[string]ort.Tensor{}
	for _, o := range outs {
		m[o.Name] = o
	}
	return m
}

// wantTensor fails t unless got has the shape (never nil: [] for a scalar) and data.
func wantTensor(t *testing.T, got ort.Tensor, shape []int64, data any) {
	t.Helper()
	if got.Shape == nil || !slices.Equal(got.Shape, shape) || !reflect.DeepEqual(got.Data, data) {
		t.Errorf("%s = %#v %#v, want %#v %#v", got.Name, got.Shape, got.Data, shape, data)
	}
}

// testScalarModel runs the generated scalar model: rank-0 input k, rank-0 outputs sum and
// count (which onnxruntime_go cannot copy when the runtime allocates them: a nil tensor
// destroyed in Run's cleanup panicked), and a zero-size x; each answer is worked out by
// hand. Its first run learns that sum and count are rank 0; every run after gives the
// same.
func (c *child) testScalarModel(t *testing.T) {
	s := c.session(t, c.model(onnxgen.ScalarDir, onnxgen.ModelFile), ort.SessionConfig{IntraOpThreads: 1})
	wantIO(t, s,
		[]ort.IOInfo{{Name: "x", Shape: []int64{-1, 3}, Type: "float32"}, {Name: "k", Type: "float32"}},
		[]ort.IOInfo{{Name: "sum", Type: "float32"}, {Name: "count", Type: "int64"}, {Name: "y", Shape: []int64{-1, 3}, Type: "float32"}})
	k := ort.Tensor{Name: "k", Shape: []int64{}, Data: []float32{0.5}}
	for range 3 {
		// x = [[1 2 3] [4 5 6]], k = 0.5: sum = 21*0.5, count = 6, y = x/2.
		got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}, k})
		if len(got) != 3 {
			t.Fatalf("outputs %v, want sum, count and y", got)
		}
		wantTensor(t, got["sum"], []int64{}, []float32{10.5})
		wantTensor(t, got["count"], []int64{}, []int64{6})
		wantTensor(t, got["y"], []int64{2, 3}, []float32{0.5, 1, 1.5, 2, 2.5, 3})
	}
	// Zero rows: the sum of nothing is 0, y has no element.
	got := outputsByName(t, s, []ort.Tensor{{Name: "x", Shape: []int64{0, 3}, Data: []float32{}}, {Name: "k", Data: []float32{-3}}})
	wantTensor(t, got["sum"], []int64{}, []float32{0})
	wantTensor(t, got["count"], []int64{}, []int64{0})
	wantTensor(t, got["y"], []int64{0, 3}, []float32{})
	// Concurrent runs share the learnt shapes.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			outs, err := s.Run(context.Background(), []ort.Tensor{{Name: "x", Shape: []int64{1, 3}, Data: []float32{float32(i), 1, 2}}, {Name: "k", Data: []float32{2}}})
			if err != nil || len(outs) != 3 || outs[0].Float32()[0] != float32(2*(i+3)) {
				t.Errorf("run %d: %v %v, want sum %d", i, outs, err, 2*(i+3))
			}
		})
	}
	wg.Wait()
}

// testConstModel runs the generated model without inputs (its outputs come from
// Constant nodes: onnxruntime_go's plain run panicked, index out of range): a rank-0
// int64, a [2,3] float and a zero-size [0,2] float.
func (c *child) testConstModel(t *testing.T) {
	s := c.session(t, c.model(onnxgen.ConstDir, onnxgen.ModelFile), ort.SessionConfig{})
	wantIO(t, s, []ort.IOInfo{},
		[]ort.IOInfo{{Name: "answer", Type: "int64"}, {Name: "table", Shape: []int64{2, 3}, Type: "float32"}, {Name: "none", Shape: []int64{0, 2}, Type: "float32"}})
	for _, ins := range [][]ort.Tensor{nil, {{Name: "ignored", Shape: []int64{1}, Data: []float32{1}}}} {
		got := outputsByName(t, s, ins)
		wantTensor(t, got["answer"], []int64{}, []int64{42})
		wantTensor(t, got["table"], []int64{2, 3}, []float32{0.5, 1.5, 2.5, -1, -2, 1e6})
		wantTensor(t, got["none"], []int64{0, 2}, []float32{})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Run(ctx, nil); codec.CodeOf(err) != codec.CodeCancelled {
		t.Errorf("Run with a cancelled context: %v, want cancelled", err)
	}
	// Without inputs, an output of a dynamic shape cannot be preallocated: refused at load.
	g := onnxgen.NewGraph("dynamic_const")
	g.AddOutput("v", onnxgen.Float, "N")
	g.AddNode("ConstantOfShape", []string{g.Op("Constant", nil, onnxgen.AttrTensor("value", onnxgen.Int64Tensor("n", []int64{1}, []int64{3})))}, []string{"v"})
	path := filepath.Join(t.TempDir(), "dynamic.onnx")
	if err := g.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if s, err := c.rt.NewSession(path, ort.SessionConfig{}); err == nil {
		// The runtime may infer the shape [3]: then it runs.
		defer s.Close()
		got := outputsByName(t, s, nil)
		wantTensor(t, got["v"], []int64{3}, []float32{0, 0, 0})
	} else if codec.CodeOf(err) != codec.CodeModelUnavailable || !strings.Contains(err.Error(), "dynamic shape") {
		t.Errorf("NewSession of a model without inputs and a dynamic output: %v, want model_unavailable naming the dynamic shape", err)
	}
}

// testUnknownRank: an output declared without a shape is reported like a rank-0 one (no
// dimensions); one that is not rank 0 is left to the runtime to allocate, one that is
// is learnt at its first run. y = Reshape(x, shape) (rank len(shape)), s = ReduceSum(x).
func (c *child) testUnknownRank(t *testing.T) {
	g := onnxgen.NewGraph("unknown_rank")
	g.AddInput("x", onnxgen.Float, "N")
	g.AddInput("shape", onnxgen.Int64, "K")
	g.AddOutputNoShape("y", onnxgen.Float)
	g.AddOutputNoShape("s", onnxgen.Float)
	g.AddNode("Reshape", []string{"x", "shape"}, []string{"y"})
	g.AddNode("ReduceSum", []string{"x"}, []string{"s"}, onnxgen.AttrInt("keepdims", 0))
	path := filepath.Join(t.TempDir(), "unknown.onnx")
	if err := g.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	s := c.session(t, path, ort.SessionConfig{})
	x := ort.Tensor{Name: "x", Shape: []int64{4}, Data: []float32{1, 2, 3, 4}}
	for _, shape := range [][]int64{{2, 2}, {4}, {1, 1, 4}, {2, 2}} {
		got := outputsByName(t, s, []ort.Tensor{x, {Name: "shape", Shape: []int64{int64(len(shape))}, Data: shape}})
		wantTensor(t, got["y"], shape, []float32{1, 2, 3, 4})
		wantTensor(t, got["s"], []int64{}, []float32{10})
	}
}

// testUnreturnableOutput: a model with an output ortbus cannot return (a sequence) loads
// and runs; that output is left out, and Returns says so.
func (c *child) testUnreturnableOutput(t *testing.T) {
	g := onnxgen.NewGraph("with_sequence")
	g.AddInput("x", onnxgen.Float, 2)
	g.AddOutput("y", onnxgen.Float, 2)
	g.AddOutputSequence("parts", onnxgen.Float)
	g.AddNode("Neg", []string{"x"}, []string{"y"})
	g.AddNode("SequenceConstruct", []string{"x", "x"}, []string{"parts"})
	path := filepath.Join(t.TempDir(), "sequence.onnx")
	if err := g.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	s := c.session(t, path, ort.SessionConfig{})
	if len(s.Outputs) != 2 || s.Outputs[1].Type != "sequence" || !s.Returns("y") || s.Returns("parts") {
		t.Errorf("outputs %+v, Returns(y) %v, Returns(parts) %v: want parts a sequence, not returned", s.Outputs, s.Returns("y"), s.Returns("parts"))
	}
	outs, err := s.Run(context.Background(), []ort.Tensor{{Name: "x", Shape: []int64{2}, Data: []float32{1, -2}}})
	if err != nil || len(outs) != 1 {
		t.Fatalf("Run: %v %v, want y alone", outs, err)
	}
	wantTensor(t, outs[0], []int64{2}, []float32{-1, 2})

	// A model whose only output cannot be returned cannot be served: refused at load.
	g = onnxgen.NewGraph("only_sequence")
	g.AddInput("x", onnxgen.Float, 2)
	g.AddOutputSequence("parts", onnxgen.Float)
	g.AddNode("SequenceConstruct", []string{"x"}, []string{"parts"})
	if err := g.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if _, err := c.rt.NewSession(path, ort.SessionConfig{}); codec.CodeOf(err) != codec.CodeModelUnavailable {
		t.Errorf("NewSession of a model with only a sequence output: %v, want model_unavailable", err)
	}
}

// testUnloadable: a file the runtime refuses (an operator it does not know, bytes that
// are no model) is model_unavailable with the runtime's text, and no session.
func (c *child) testUnloadable(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "unloadable.onnx")
	if err := onnxgen.UnloadableGraph().WriteFile(bad); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk.onnx")
	if err := os.WriteFile(junk, []byte("this is not an ONNX model"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := ort.SessionsCreated()
	for path, text := range map[string]string{bad: "NoSuchOp", junk: ""} {
		_, err := c.rt.NewSession(path, ort.SessionConfig{})
		if codec.CodeOf(err) != codec.CodeModelUnavailable || !strings.Contains(err.Error(), text) {
			t.Errorf("NewSession(%s): %v, want model_unavailable with the runtime's text %q", filepath.Base(path), err, text)
		}
	}
	if ort.SessionsCreated() != before {
		t.Error("a refused model counted a session")
	}
}

// testProbeChain: a chain with a usable provider probes fine; one whose every provider
// cannot be appended is provider_unavailable naming each.
func (c *child) testProbeChain(t *testing.T) {
	for _, chain := range [][]ort.Provider{nil, {{Name: "cpu"}}, {{Name: "cuda"}, {Name: "cpu"}}} {
		if err := c.rt.ProbeChain(ort.SessionConfig{Providers: chain}); err != nil {
			t.Errorf("ProbeChain(%v): %v", chain, err)
		}
	}
	err := c.rt.ProbeChain(ort.SessionConfig{Providers: []ort.Provider{{Name: "cuda"}, {Name: "tensorrt"}}})
	e := codec.AsError(err)
	if e == nil || e.Code != codec.CodeProviderUnavailable || e.Details["ep"] != "cuda" {
		t.Fatalf("ProbeChain(cuda, tensorrt) on the CPU-only library: %v, want provider_unavailable for cuda", err)
	}
	if tried, _ := e.Details["tried"].([]string); len(tried) != 2 {
		t.Errorf("details tried = %v, want cuda and tensorrt", e.Details["tried"])
	}
}

// testConcurrent runs one tiny session from four goroutines at once, each with its own
// batch size, two of them through the plain run and two through the cancellable one
// (a context with a Done channel); run with -race.
func (c *child) testConcurrent(t *testing.T) {
	s := c.session(t, c.model(onnxgen.TinyDir, onnxgen.ModelFile), ort.SessionConfig{})
	const iters = 100
	batches := []int{1, 2, 5, 16}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, len(batches)*iters)
	for g, n := range batches {
		wg.Go(func() {
			ctx := context.Background()
			if g%2 == 1 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Minute)
				defer cancel()
			}
			<-start
			for it := 0; it < iters; it++ {
				x := tinyInput(n, g*iters+it)
				outs, err := s.Run(ctx, []ort.Tensor{{Name: "x", Shape: []int64{int64(n), onnxgen.TinyDim}, Data: x}})
				if err != nil {
					errs <- fmt.Errorf("goroutine %d (batch %d) iteration %d: %v", g, n, it, err)
					return
				}
				want := onnxgen.RefTiny(x)
				got := outs[0].Float32()
				if !slices.Equal(outs[0].Shape, []int64{int64(n), onnxgen.TinyDim}) || len(got) != len(want) {
					errs <- fmt.Errorf("goroutine %d (batch %d): output shape %v with %d values", g, n, outs[0].Shape, len(got))
					return
				}
				for i := range got {
					if math.Abs(float64(got[i]-want[i])) > tol {
						errs <- fmt.Errorf("goroutine %d (batch %d) iteration %d: y[%d] = %g, want %g", g, n, it, i, got[i], want[i])
						return
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (c *child) testSessionsCreated(t *testing.T) {
	path := c.model(onnxgen.TinyDir, onnxgen.ModelFile)
	before := ort.SessionsCreated()
	c.session(t, path, ort.SessionConfig{})
	if got := ort.SessionsCreated(); got != before+1 {
		t.Errorf("after one NewSession: SessionsCreated = %d, want %d", got, before+1)
	}
	c.session(t, path, ort.SessionConfig{})
	c.session(t, path, ort.SessionConfig{})
	if got := ort.SessionsCreated(); got != before+3 {
		t.Errorf("after three NewSessions: SessionsCreated = %d, want %d", got, before+3)
	}
	// A session that fails is not counted.
	if _, err := c.rt.NewSession(path, ort.SessionConfig{Providers: []ort.Provider{{Name: "no-such-ep"}}}); err == nil {
		t.Error("NewSession with an unknown provider succeeded")
	}
	if _, err := c.rt.NewSession(filepath.Join(t.TempDir(), "missing.onnx"), ort.SessionConfig{}); err == nil {
		t.Error("NewSession of a missing file succeeded")
	}
	if got := ort.SessionsCreated(); got != before+3 {
		t.Errorf("failed NewSessions changed SessionsCreated to %d, want %d", got, before+3)
	}
}

func (c *child) testMissingInput(t *testing.T) {
	s := c.session(t, c.model(onnxgen.TinyDir, onnxgen.ModelFile), ort.SessionConfig{})
	_, err := s.Run(context.Background(), []ort.Tensor{{Name: "nope", Shape: []int64{1, 4}, Data: make([]float32, 4)}})
	if codec.CodeOf(err) != codec.CodeBadRequest || !strings.Contains(fmt.Sprint(err), `"x"`) {
		t.Errorf("Run without input x: %v (code %q), want bad_request naming \"x\"", err, codec.CodeOf(err))
	}
	_, err = s.Run(context.Background(), []ort.Tensor{{Name: "x", Shape: []int64{1, 4}, Data: "not a tensor"}})
	if codec.CodeOf(err) != codec.CodeBadRequest {
		t.Errorf("Run with string data: %v (code %q), want bad_request", err, codec.CodeOf(err))
	}
}

func (c *child) testCancelledBeforeRun(t *testing.T) {
	s := c.session(t, c.model(onnxgen.TinyDir, onnxgen.ModelFile), ort.SessionConfig{})
	x := []ort.Tensor{{Name: "x", Shape: []int64{1, 4}, Data: make([]float32, 4)}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Run(ctx, x); codec.CodeOf(err) != codec.CodeCancelled {
		t.Errorf("Run with a cancelled context: %v (code %q), want cancelled", err, codec.CodeOf(err))
	}
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := s.Run(ctx, x); codec.CodeOf(err) != codec.CodeCancelled {
		t.Errorf("Run past its deadline: %v (code %q), want cancelled", err, codec.CodeOf(err))
	}
	// A live context goes through the run-options path and works.
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	outs, err := s.Run(ctx, x)
	if err != nil {
		t.Fatalf("Run with a live context: %v", err)
	}
	near(t, "y", outs[0].Float32(), onnxgen.RefTiny(make([]float32, 4)))
}

// cancelLayers makes an uncancelled run of the heavy tagger take well over a second on
// one core (~4 ms per layer and image), so a prompt return proves the run was stopped.
const (
	cancelLayers = 300
	cancelAfter  = 100 * time.Millisecond
	cancelBound  = 750 * time.Millisecond // from cancel to Run's return
)

func (c *child) testCancelMidRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "heavy.onnx")
	if err := onnxgen.TaggerGraph(cancelLayers).WriteFile(path); err != nil {
		t.Fatal(err)
	}
	s := c.session(t, path, ort.SessionConfig{IntraOpThreads: 1})
	in := onnxgen.NCHW(onnxgen.TaggerSize, onnxgen.TaggerNorm, onnxgen.Solid(onnxgen.ColourNames["red"]))
	x := []ort.Tensor{{Name: "input", Shape: []int64{1, 3, onnxgen.TaggerSize, onnxgen.TaggerSize}, Data: in}}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelledAt time.Time
	timer := time.AfterFunc(cancelAfter, func() { cancelledAt = time.Now(); cancel() })
	defer timer.Stop()
	start := time.Now()
	_, err := s.Run(ctx, x)
	end := time.Now()
	if codec.CodeOf(err) != codec.CodeCancelled {
		t.Fatalf("Run cancelled after %v: err = %v (code %q) after %v, want cancelled", cancelAfter, err, codec.CodeOf(err), end.Sub(start))
	}
	if cancelledAt.IsZero() || end.Before(cancelledAt) {
		t.Fatalf("Run returned %v before the cancel: %v", end.Sub(start), err)
	}
	if lag := end.Sub(cancelledAt); lag > cancelBound {
		t.Errorf("Run returned %v after the cancel, want <= %v", lag, cancelBound)
	}
	t.Logf("cancelled after %v, returned %v later: %v", cancelAfter, end.Sub(cancelledAt).Round(time.Millisecond), err)
	// The next runs with a context reuse RunOptions: never the one this run terminated.
	for i := range 2 {
		if _, err := s.Run(context.Background(), x); err != nil {
			t.Fatalf("run %d after the cancelled one: %v", i+1, err)
		}
		live, stop := context.WithCancel(context.Background())
		_, err := s.Run(live, x)
		stop()
		if err != nil {
			t.Fatalf("run %d with a live context after the cancelled one: %v", i+1, err)
		}
	}
}

func (c *child) testProviders(t *testing.T) {
	tiny := c.model(onnxgen.TinyDir, onnxgen.ModelFile)
	for _, tc := range []struct{ ep, text string }{
		{"cuda", "Failed to load"},
		{"openvino", "Failed to load"},
		{"tensorrt", "Failed to load"},
	} {
		t.Run(tc.ep, func(t *testing.T) {
			before := ort.SessionsCreated()
			s, err := c.rt.NewSession(tiny, ort.SessionConfig{Providers: []ort.Provider{{Name: tc.ep}}})
			if err == nil {
				s.Close()
				t.Fatalf("%s on the CPU-only library: a session was created (EP %q)", tc.ep, s.EP)
			}
			if got := codec.CodeOf(err); got != codec.CodeProviderUnavailable {
				t.Fatalf("code = %q (%v), want provider_unavailable", got, err)
			}
			e := codec.AsError(err)
			if e.Details["ep"] != tc.ep {
				t.Errorf("details ep = %v, want %q", e.Details["ep"], tc.ep)
			}
			runtimeText, _ := e.Details["error"].(string)
			if runtimeText == "" {
				t.Errorf("details error = %v, want the runtime's text", e.Details["error"])
			}
			if tried, _ := e.Details["tried"].([]string); len(tried) != 1 {
				t.Errorf("details tried = %v, want one attempt", e.Details["tried"])
			}
			if tc.text != "" && !strings.Contains(err.Error(), tc.text) && !strings.Contains(err.Error(), "providers_shared") {
				t.Errorf("message %q does not carry the runtime's own error (%q or providers_shared)", err, tc.text)
			}
			if ort.SessionsCreated() != before {
				t.Errorf("a failed NewSession counted a session")
			}
			t.Logf("%v", err)
		})
	}

	t.Run("cuda,cpu", func(t *testing.T) {
		before := ort.SessionsCreated()
		s := c.session(t, tiny, ort.SessionConfig{Providers: []ort.Provider{{Name: "cuda"}, {Name: "cpu"}}})
		if s.EP != "cpu" {
			t.Errorf("EP = %q, want cpu (cuda is unavailable)", s.EP)
		}
		if got := ort.SessionsCreated(); got != before+1 {
			t.Errorf("SessionsCreated = %d, want %d", got, before+1)
		}
		x := tinyInput(3, 7)
		got, _ := run(t, s, "x", []int64{3, onnxgen.TinyDim}, x)
		near(t, "y", got, onnxgen.RefTiny(x))
	})

	t.Run("openvino,cuda", func(t *testing.T) {
		_, err := c.rt.NewSession(tiny, ort.SessionConfig{Providers: []ort.Provider{
			{Name: "openvino", Options: map[string]string{"device_type": "GPU"}}, {Name: "cuda"}}})
		if codec.CodeOf(err) != codec.CodeProviderUnavailable {
			t.Fatalf("err = %v, want provider_unavailable", err)
		}
		e := codec.AsError(err)
		if e.Details["ep"] != "openvino" {
			t.Errorf("details ep = %v, want the preferred provider openvino", e.Details["ep"])
		}
		if tried, _ := e.Details["tried"].([]string); len(tried) != 2 ||
			!strings.HasPrefix(tried[0], "openvino: ") || !strings.HasPrefix(tried[1], "cuda: ") {
			t.Errorf("details tried = %q, want openvino then cuda", e.Details["tried"])
		}
	})
}

func (c *child) testOneRuntime(t *testing.T, other string) {
	if other == "" || other == c.rt.Path {
		t.Fatalf("no second runtime library to try (%s=%q)", envOther, other)
	}
	rt, err := ort.Load(other)
	if err == nil {
		t.Fatalf("Load(%s) in a process already running %s succeeded (version %s)", other, c.rt.Path, rt.Version)
	}
	msg := err.Error()
	if !strings.Contains(msg, c.rt.Path) || !strings.Contains(msg, "one runtime per process") {
		t.Errorf("Load of a second library: %q, want it to name the loaded %s and say one runtime per process", msg, c.rt.Path)
	}
	if _, err := ort.LoadSpec(ort.Spec{Path: other}); err == nil {
		t.Errorf("LoadSpec of a second library succeeded")
	}
	// Loading the same library again is allowed and gives the same runtime.
	again, err := ort.Load(c.rt.Path)
	if err != nil || again != c.rt {
		t.Errorf("Load(%s) again = %p, %v; want the loaded runtime %p", c.rt.Path, again, err, c.rt)
	}
	// The loaded runtime still works.
	s := c.session(t, c.model(onnxgen.TinyDir, onnxgen.ModelFile), ort.SessionConfig{})
	x := tinyInput(2, 3)
	got, _ := run(t, s, "x", []int64{2, onnxgen.TinyDim}, x)
	near(t, "y after a refused Load", got, onnxgen.RefTiny(x))
}

// ---- Library finding: nothing here loads a runtime, so it runs in the parent. ----

func TestCandidatesOrder(t *testing.T) {
	spec := ort.Spec{
		Path: "/opt/explicit/libonnxruntime.so.1",
		Dirs: []string{"/opt/ort", "/opt/other/lib"},
		Env: map[string]string{
			"ORT_DYLIB_PATH":  "/env/libonnxruntime.so.1",
			"LD_LIBRARY_PATH": "/ld1::/opt/ort",
		},
	}
	want := []string{
		"/opt/explicit/libonnxruntime.so.1",
		"/env/libonnxruntime.so.1",
		"/opt/ort/libonnxruntime.so.1", "/opt/ort/libonnxruntime.so",
		"/opt/ort/lib/libonnxruntime.so.1", "/opt/ort/lib/libonnxruntime.so",
		"/opt/other/lib/libonnxruntime.so.1", "/opt/other/lib/libonnxruntime.so",
		"/ld1/libonnxruntime.so.1", "/ld1/libonnxruntime.so",
		"/ld1/lib/libonnxruntime.so.1", "/ld1/lib/libonnxruntime.so",
	}
	if got := spec.Candidates(); !slices.Equal(got, want) {
		t.Errorf("Candidates =\n  %q\nwant\n  %q", got, want)
	}
	if !spec.Configured() {
		t.Error("Configured = false for a spec with paths")
	}
	if (ort.Spec{}).Configured() {
		t.Error("Configured = true for an empty spec")
	}
}

func TestFindMissing(t *testing.T) {
	dir := t.TempDir()
	spec := ort.Spec{Path: "/nonexistent/libonnxruntime.so.1", Dirs: []string{dir}}
	p, err := spec.Find()
	if codec.CodeOf(err) != codec.CodeRuntimeMissing {
		t.Fatalf("Find = %q, %v; want runtime_missing", p, err)
	}
	searched, ok := codec.AsError(err).Details["searched"].([]string)
	if !ok {
		t.Fatalf("details searched = %#v, want []string", codec.AsError(err).Details["searched"])
	}
	cands := spec.Candidates()
	if !slices.Equal(searched, cands) {
		t.Errorf("searched = %q, want every candidate %q", searched, cands)
	}
	for _, want := range []string{
		"/nonexistent/libonnxruntime.so.1",
		filepath.Join(dir, "libonnxruntime.so.1"), filepath.Join(dir, "libonnxruntime.so"),
		filepath.Join(dir, "lib", "libonnxruntime.so.1"), filepath.Join(dir, "lib", "libonnxruntime.so"),
	} {
		if !slices.Contains(searched, want) {
			t.Errorf("searched lacks %s", want)
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %s: %v", want, err)
		}
	}

	// Nothing configured at all.
	_, err = ort.Spec{}.Find()
	if codec.CodeOf(err) != codec.CodeRuntimeMissing {
		t.Errorf("empty spec: %v, want runtime_missing", err)
	}
	// Load of a missing file fails before anything is loaded.
	if _, err := ort.Load("/nonexistent/libonnxruntime.so.1"); codec.CodeOf(err) != codec.CodeRuntimeMissing {
		t.Errorf("Load of a missing file: %v, want runtime_missing", err)
	}
	if _, err := ort.LoadSpec(spec); codec.CodeOf(err) != codec.CodeRuntimeMissing {
		t.Errorf("LoadSpec of a missing library: %v, want runtime_missing", err)
	}
}

func TestFindRefusesNonELF(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "libonnxruntime.so.1")
	if err := os.WriteFile(text, []byte("INPUT(libonnxruntime.so.1.30.0)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory under the other library name is refused too.
	if err := os.Mkdir(filepath.Join(dir, "libonnxruntime.so"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := ort.Spec{Dirs: []string{dir}}.Find()
	if codec.CodeOf(err) != codec.CodeRuntimeMissing {
		t.Fatalf("Find over a text file: %v, want runtime_missing", err)
	}
	reasons := fmt.Sprint(codec.AsError(err).Details["reasons"])
	if !strings.Contains(reasons, text+": not an ELF") {
		t.Errorf("reasons %s do not say %s is not an ELF library", reasons, text)
	}
	if !strings.Contains(reasons, "not a regular file") {
		t.Errorf("reasons %s do not refuse the directory", reasons)
	}
	if _, err := ort.Load(text); codec.CodeOf(err) != codec.CodeRuntimeMissing || !strings.Contains(err.Error(), "not an ELF") {
		t.Errorf("Load of a text file: %v, want runtime_missing (not an ELF)", err)
	}

	// A refused candidate is skipped for the next good one.
	lib := testenv.RuntimeLib(t, testenv.Versions[0])
	prefix := filepath.Dir(filepath.Dir(lib))
	got, err := ort.Spec{Path: text, Dirs: []string{prefix}}.Find()
	if err != nil || got != lib {
		t.Errorf("Find(text file, then %s) = %q, %v; want %s", prefix, got, err, lib)
	}
	got, err = ort.Spec{Env: map[string]string{"LD_LIBRARY_PATH": dir + ":" + filepath.Dir(lib)}}.Find()
	if err != nil || got != lib {
		t.Errorf("Find via LD_LIBRARY_PATH = %q, %v; want %s", got, err, lib)
	}
}
