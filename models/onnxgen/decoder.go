package onnxgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
)

// A decoder-shaped language model: the compute of a small GPT-style LLM (token and
// position embeddings, pre-norm transformer blocks of one attention head with a key/value
// cache and a ReLU MLP, a final norm and the vocabulary projection), with deterministic
// weights and no training: the tokens it generates mean nothing, but each call costs
// what a call of such a model costs. One graph serves both phases:
//
//	prefill: the prompt's T tokens at once, after a past of one masked zero slot;
//	step:    one token (T = 1) after the cache of everything before it.
//
// Inputs: ids int64 [1,T] (token ids < Vocab), pos int64 [1,T] (positions < MaxPos),
// mask float32 [T,S] (added to the attention scores: 0 where a token may attend, a large
// negative number elsewhere; S = P + T), past_k_L and past_v_L float32 [1,P,Width] for
// each layer L. Outputs: logits float32 [1,1,Vocab] (the last token's), present_k_L and
// present_v_L float32 [1,S,Width] (the past for the next call). Because the past always
// has at least one slot (the first call's is zeros, masked out by column 0 of the mask),
// no tensor is ever empty.

// DecoderDir is the decoder's folder under Generate's dir; DecoderFile its model file.
const (
	DecoderDir  = "decoder"
	DecoderFile = "decoder.onnx"
)

// DecoderSpec is a decoder's shape.
type DecoderSpec struct {
	Layers int // transformer blocks
	Width  int // model width (the attention head's, the embeddings')
	FF     int // the MLP's hidden width
	Vocab  int
	MaxPos int // positions the position embedding holds
}

// DefaultDecoder is the LLM-shaped tenant's model in the benches: 4 blocks of width 512
// (MLP 2048), a 4096-token vocabulary, 2048 positions: 17.8 M parameters (71 MB of
// float32), about 15 M multiply-adds per generated token besides attention.
var DefaultDecoder = DecoderSpec{Layers: 4, Width: 512, FF: 2048, Vocab: 4096, MaxPos: 2048}

// Params is the decoder's parameter count.
func (s DecoderSpec) Params() int {
	w, f := s.Width, s.FF
	perLayer := 4*w*w + 2*w*f + f + w + 4*w // q, k, v, o; the MLP and its biases; two norms
	return s.Layers*perLayer + 2*s.Vocab*w + s.MaxPos*w + 2*w
}

func (s DecoderSpec) check() error {
	if s.Layers <= 0 || s.Width <= 0 || s.FF <= 0 || s.Vocab <= 1 || s.MaxPos <= 1 {
		return fmt.Errorf("onnxgen: decoder %+v: every size must be positive", s)
	}
	return nil
}

// DecoderGraph builds the decoder (see above). Weights are uniform in ±1/sqrt(fan-in)
// from a fixed-seed PCG, so every machine writes the same bytes and the activations stay
// finite through the blocks.
func DecoderGraph(s DecoderSpec) (*Graph, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rng := rand.NewPCG(0xdec0de, uint64(s.Layers)<<32|uint64(s.Width))
	w64, ff64, v64 := int64(s.Width), int64(s.FF), int64(s.Vocab)
	g := NewGraph("onnxgen_decoder")
	uniform := func(name string, dims []int64, bound float64) string {
		n := int64(1)
		for _, d := range dims {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32((2*unitFloat(rng) - 1) * bound)
		}
		return g.AddFloat(name, dims, data)
	}
	ones := func(name string) string {
		d := make([]float32, s.Width)
		for i := range d {
			d[i] = 1
		}
		return g.AddFloat(name, []int64{w64}, d)
	}
	zeros := func(name string, n int64) string { return g.AddFloat(name, []int64{n}, make([]float32, n)) }
	norm := func(x, name string) string {
		return g.Op("LayerNormalization", []string{x, ones(name + "_g"), zeros(name+"_b", w64)}, AttrInt("axis", -1), AttrFloat("epsilon", 1e-5))
	}

	g.AddInput("ids", Int64, 1, "T")
	g.AddInput("pos", Int64, 1, "T")
	g.AddInput("mask", Float, "T", "S")
	for l := range s.Layers {
		g.AddInput(fmt.Sprintf("past_k_%d", l), Float, 1, "P", s.Width)
		g.AddInput(fmt.Sprintf("past_v_%d", l), Float, 1, "P", s.Width)
	}
	g.AddOutput("logits", Float, 1, 1, s.Vocab)
	for l := range s.Layers {
		g.AddOutput(fmt.Sprintf("present_k_%d", l), Float, 1, "S", s.Width)
		g.AddOutput(fmt.Sprintf("present_v_%d", l), Float, 1, "S", s.Width)
	}

	tok := uniform("tok_emb", []int64{v64, w64}, 1)
	posEmb := uniform("pos_emb", []int64{int64(s.MaxPos), w64}, 0.5)
	x := g.Op("Add", []string{g.Op("Gather", []string{tok, "ids"}), g.Op("Gather", []string{posEmb, "pos"})})
	inW, inF := 1/math.Sqrt(float64(s.Width)), 1/math.Sqrt(float64(s.FF))
	scale := g.Scalar(float32(inW))
	for l := range s.Layers {
		p := fmt.Sprintf("l%d_", l)
		h := norm(x, p+"ln1")
		q := g.Op("MatMul", []string{h, uniform(p+"wq", []int64{w64, w64}, inW)})
		k := g.Op("MatMul", []string{h, uniform(p+"wk", []int64{w64, w64}, inW)})
		v := g.Op("MatMul", []string{h, uniform(p+"wv", []int64{w64, w64}, inW)})
		kAll, vAll := fmt.Sprintf("present_k_%d", l), fmt.Sprintf("present_v_%d", l)
		g.AddNode("Concat", []string{fmt.Sprintf("past_k_%d", l), k}, []string{kAll}, AttrInt("axis", 1))
		g.AddNode("Concat", []string{fmt.Sprintf("past_v_%d", l), v}, []string{vAll}, AttrInt("axis", 1))
		scores := g.Op("Mul", []string{g.Op("MatMul", []string{q, g.Op("Transpose", []string{kAll}, AttrInts("perm", 0, 2, 1))}), scale})
		att := g.Op("Softmax", []string{g.Op("Add", []string{scores, "mask"})}, AttrInt("axis", -1))
		ctx := g.Op("MatMul", []string{att, vAll})
		x = g.Op("Add", []string{x, g.Op("MatMul", []string{ctx, uniform(p+"wo", []int64{w64, w64}, inW)})})
		h = norm(x, p+"ln2")
		up := g.Op("Relu", []string{g.Op("Add", []string{g.Op("MatMul", []string{h, uniform(p+"w1", []int64{w64, ff64}, inW)}), zeros(p+"b1", ff64)})})
		down := g.Op("Add", []string{g.Op("MatMul", []string{up, uniform(p+"w2", []int64{ff64, w64}, inF)}), zeros(p+"b2", w64)})
		x = g.Op("Add", []string{x, down})
	}
	last := g.Op("Slice", []string{norm(x, "ln_f"), g.AddInt64("", []int64{1}, []int64{-1}), g.AddInt64("", []int64{1}, []int64{math.MaxInt64}), g.AddInt64("", []int64{1}, []int64{1})})
	g.AddNode("MatMul", []string{last, uniform("lm_head", []int64{w64, v64}, inW)}, []string{"logits"})
	return g, nil
}

// GenerateDecoder writes the decoder of spec as dir/decoder.onnx (unchanged bytes are not
// rewritten).
func GenerateDecoder(dir string, s DecoderSpec) error {
	g, err := DecoderGraph(s)
	if err != nil {
		return err
	}
	return writeIfChanged(filepath.Join(dir, DecoderFile), g.Bytes())
}
