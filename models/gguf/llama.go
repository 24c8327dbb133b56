package gguf

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/x448/float16"
)

// Llama is the shape of a generated llama-architecture model. Its weights are random but
// deterministic: the same Llama gives the same bytes on every run and host.
type Llama struct {
	Name    string // general.name
	Embed   int    // embedding length (n_embd)
	FF      int    // feed-forward length
	Layers  int    // blocks
	Heads   int    // attention heads
	KVHeads int    // key/value heads (grouped-query attention when below Heads)
	Context int    // the context length the model declares
	F16     bool   // matrices as f16 (norms stay f32, as llama.cpp's own converters write them)
	Seed    uint64
}

// The generated sizes: Tiny for the tests (CI), Bench for the benches.
var (
	// Tiny is about 14 MB: 8 blocks of width 256 in f16.
	Tiny = Llama{Name: "ortbus-llm-tiny", Embed: 256, FF: 768, Layers: 8, Heads: 4, KVHeads: 4, Context: 2048, F16: true, Seed: 1}
	// Bench is about 360 MB: 14 blocks of width 1024 in f16.
	Bench = Llama{Name: "ortbus-llm-bench", Embed: 1024, FF: 2816, Layers: 14, Heads: 16, KVHeads: 16, Context: 4096, F16: true, Seed: 1}
)

// GeneratorVersion names the weight-generation algorithm in each file's metadata
// (ortbus.generator): change it whenever the bytes for a given Llama change, so a file
// made before is regenerated.
const GeneratorVersion = "ortbus models/gguf 1"

// Sizes names the generated sizes (`ortbus models gen-llm -size NAME`).
var Sizes = map[string]Llama{"tiny": Tiny, "bench": Bench}

// SizeNames is the sorted keys of Sizes.
func SizeNames() []string {
	names := make([]string, 0, len(Sizes))
	for k := range Sizes {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// The vocabulary: llama.cpp's byte-level BPE ("gpt2") tokenizer with no merges: token b
// (0..255) is the byte b, written as GPT-2's byte-to-character mapping writes it, then
// the BOS and the EOS token. Any text tokenizes to one token per byte and detokenizes
// back to the same bytes (llama.cpp's SentencePiece tokenizer would turn each space into
// "▁" bytes that a byte vocabulary gives back as they are).
const (
	TokenBOS  = 256
	TokenEOS  = 257
	VocabSize = 258
	// llama.cpp's token types
	tokNormal  = 1
	tokControl = 3
)

// FileName is the file GenerateLlama writes in its directory for the size name.
func FileName(size string) string { return "llm-" + size + ".gguf" }

// Validate reports a shape llama.cpp would refuse or this generator cannot write.
func (l Llama) Validate() error {
	switch {
	case l.Embed <= 0 || l.FF <= 0 || l.Layers <= 0 || l.Heads <= 0 || l.KVHeads <= 0 || l.Context <= 0:
		return fmt.Errorf("gguf: llama %q: every dimension must be positive", l.Name)
	case l.Embed%l.Heads != 0:
		return fmt.Errorf("gguf: llama %q: embedding %d is not a multiple of %d heads", l.Name, l.Embed, l.Heads)
	case l.Heads%l.KVHeads != 0:
		return fmt.Errorf("gguf: llama %q: %d heads are not a multiple of %d key/value heads", l.Name, l.Heads, l.KVHeads)
	case (l.Embed/l.Heads)%2 != 0:
		return fmt.Errorf("gguf: llama %q: head size %d is odd (rope rotates pairs)", l.Name, l.Embed/l.Heads)
	}
	return nil
}

// File is l as a GGUF file: llama.cpp's llama metadata, the byte vocabulary, and the
// tensors of the llama architecture (tensor names as llama.cpp's loader expects them).
func (l Llama) File() (*File, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	fileType := uint32(0) // all f32
	if l.F16 {
		fileType = 1 // mostly f16
	}
	headDim := l.Embed / l.Heads
	kvDim := headDim * l.KVHeads
	f := &File{KVs: append([]KV{
		{"general.architecture", "llama"},
		{"general.name", l.Name},
		{"general.alignment", uint32(DefaultAlignment)},
		{"general.file_type", fileType},
		{"llama.context_length", uint32(l.Context)},
		{"llama.embedding_length", uint32(l.Embed)},
		{"llama.block_count", uint32(l.Layers)},
		{"llama.feed_forward_length", uint32(l.FF)},
		{"llama.attention.head_count", uint32(l.Heads)},
		{"llama.attention.head_count_kv", uint32(l.KVHeads)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.dimension_count", uint32(headDim)},
		{"llama.rope.freq_base", float32(10000)},
		{"llama.vocab_size", uint32(VocabSize)},
		{"ortbus.generator", GeneratorVersion},
		{"ortbus.generator.seed", l.Seed},
	}, vocabKVs()...)}
	mat := F32
	if l.F16 {
		mat = F16
	}
	add := func(name string, typ TensorType, dims ...int) {
		f.Tensors = append(f.Tensors, l.tensor(name, typ, dims))
	}
	add("token_embd.weight", mat, l.Embed, VocabSize)
	for i := 0; i < l.Layers; i++ {
		b := fmt.Sprintf("blk.%d.", i)
		add(b+"attn_norm.weight", F32, l.Embed)
		add(b+"attn_q.weight", mat, l.Embed, l.Embed)
		add(b+"attn_k.weight", mat, l.Embed, kvDim)
		add(b+"attn_v.weight", mat, l.Embed, kvDim)
		add(b+"attn_output.weight", mat, l.Embed, l.Embed)
		add(b+"ffn_norm.weight", F32, l.Embed)
		add(b+"ffn_gate.weight", mat, l.Embed, l.FF)
		add(b+"ffn_up.weight", mat, l.Embed, l.FF)
		add(b+"ffn_down.weight", mat, l.FF, l.Embed)
	}
	add("output_norm.weight", F32, l.Embed)
	add("output.weight", mat, l.Embed, VocabSize)
	return f, nil
}

// vocabKVs is the tokenizer metadata of the byte vocabulary.
func vocabKVs() []KV {
	tokens := make([]string, VocabSize)
	types := make([]int32, VocabSize)
	byteChars := gpt2ByteChars()
	for b := 0; b < 256; b++ {
		tokens[b], types[b] = string(byteChars[b]), tokNormal
	}
	tokens[TokenBOS], types[TokenBOS] = "<s>", tokControl
	tokens[TokenEOS], types[TokenEOS] = "</s>", tokControl
	return []KV{
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.pre", "default"},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.merges", []string{}},
		{"tokenizer.ggml.bos_token_id", uint32(TokenBOS)},
		{"tokenizer.ggml.eos_token_id", uint32(TokenEOS)},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
	}
}

// gpt2ByteChars is GPT-2's bytes_to_unicode: the printable bytes ('!'..'~', '¡'..'¬',
// '®'..'ÿ') stand for themselves, every other byte for U+0100 onwards in byte order.
func gpt2ByteChars() [256]rune {
	var m [256]rune
	next := rune(256)
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			m[b] = rune(b)
		} else {
			m[b] = next
			next++
		}
	}
	return m
}

// tensor is one weight of l: a norm (one dimension) is all ones, as a trained model's
// start; a matrix is uniform in ±1/sqrt(fan-in), which keeps activations bounded through
// the blocks, from a stream seeded by l.Seed and the tensor's name (so each tensor's
// bytes depend on nothing else, in particular not on the order of the others).
func (l Llama) tensor(name string, typ TensorType, dims []int) Tensor {
	ud := make([]uint64, len(dims))
	for i, d := range dims {
		ud[i] = uint64(d)
	}
	t := Tensor{Name: name, Dims: ud, Type: typ}
	if len(dims) == 1 {
		t.Fill = func(dst []byte) { fill(dst, typ, func() float32 { return 1 }) }
		return t
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	seed := l.Seed ^ h.Sum64()
	scale := float32(1 / math.Sqrt(float64(dims[0])))
	t.Fill = func(dst []byte) {
		rng := splitmix{state: seed}
		fill(dst, typ, func() float32 { return rng.symmetric() * scale })
	}
	return t
}

// fill writes next() for each element of dst, as typ.
func fill(dst []byte, typ TensorType, next func() float32) {
	switch typ {
	case F32:
		for i := 0; i+4 <= len(dst); i += 4 {
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(next()))
		}
	case F16:
		for i := 0; i+2 <= len(dst); i += 2 {
			binary.LittleEndian.PutUint16(dst[i:], float16.Fromfloat32(next()).Bits())
		}
	}
}

// splitmix is SplitMix64: a tiny generator whose output is fixed by its definition, so
// the generated bytes never change with a Go release (math/rand's streams may).
type splitmix struct{ state uint64 }

func (s *splitmix) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// symmetric is uniform in [-1, 1), from the top 24 bits.
func (s *splitmix) symmetric() float32 {
	return float32(s.next()>>40)/(1<<23) - 1
}

// GenerateLlama writes l into dir as FileName(size) and returns its path. A file already
// there with the right size and header is left alone (make-style freshness: the
// generator is deterministic, so the same header and size mean the same model).
func GenerateLlama(dir, size string) (string, error) {
	l, ok := Sizes[size]
	if !ok {
		return "", fmt.Errorf("gguf: unknown size %q (one of %v)", size, SizeNames())
	}
	f, err := l.File()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, FileName(size))
	if upToDate(path, f) {
		return path, nil
	}
	return path, f.WriteFile(path)
}

// upToDate is whether path already holds f: same size, same metadata and tensor infos.
func upToDate(path string, f *File) bool {
	st, err := os.Stat(path)
	if err != nil {
		return false
	}
	want, err := f.Size()
	if err != nil || uint64(st.Size()) != want {
		return false
	}
	h, err := ReadHeaderFile(path)
	if err != nil || len(h.KVs) != len(f.KVs) || len(h.Tensors) != len(f.Tensors) {
		return false
	}
	for i, kv := range f.KVs {
		if h.KVs[i].Key != kv.Key || fmt.Sprint(h.KVs[i].Value) != fmt.Sprint(kv.Value) {
			return false
		}
	}
	for i := range f.Tensors {
		if h.Tensors[i].Name != f.Tensors[i].Name || !slices.Equal(h.Tensors[i].Dims, f.Tensors[i].Dims) || h.Tensors[i].Type != f.Tensors[i].Type {
			return false
		}
	}
	return true
}
