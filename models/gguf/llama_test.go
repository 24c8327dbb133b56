package gguf

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// tinySHA256 pins the bytes of Tiny: a change to the generator that changes them must
// also change GeneratorVersion (so files made before are regenerated) and this hash.
const tinySHA256 = "2dd180fad8c6b92adba275a2bf4005d1706f56937022c7888e3358c79c94609c"

func hashOf(t *testing.T, l Llama) string {
	t.Helper()
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := f.WriteTo(h); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestDeterministic: the same Llama gives the same bytes (the pinned ones for Tiny),
// another seed other bytes.
func TestDeterministic(t *testing.T) {
	a, b := hashOf(t, Tiny), hashOf(t, Tiny)
	if a != b {
		t.Fatalf("two writes of Tiny differ: %s, %s", a, b)
	}
	if a != tinySHA256 {
		t.Fatalf("Tiny's sha256 is %s, pinned %s (a generator change? bump GeneratorVersion and the pin)", a, tinySHA256)
	}
	other := Tiny
	other.Seed = 2
	if hashOf(t, other) == a {
		t.Fatal("seed 2 gives the same bytes as seed 1")
	}
}

// TestSizes: the sizes are what the docs say (about 14 MB and 360 MB) and declare
// llama.cpp's llama metadata.
func TestSizes(t *testing.T) {
	for name, want := range map[string][2]uint64{"tiny": {13 << 20, 15 << 20}, "bench": {340 << 20, 380 << 20}} {
		f, err := Sizes[name].File()
		if err != nil {
			t.Fatal(err)
		}
		n, err := f.Size()
		if err != nil || n < want[0] || n > want[1] {
			t.Errorf("%s: %d bytes (%v), want %d..%d", name, n, err, want[0], want[1])
		}
	}
	if got := SizeNames(); !slices.Equal(got, []string{"bench", "tiny"}) {
		t.Errorf("SizeNames = %v", got)
	}
}

// TestVocabulary: token b is byte b in GPT-2's byte-to-character mapping (a bijection of
// the 256 bytes onto 256 characters), then BOS and EOS, as the metadata says.
func TestVocabulary(t *testing.T) {
	f, err := Tiny.File()
	if err != nil {
		t.Fatal(err)
	}
	h := &Header{KVs: f.KVs}
	tokens, _ := h.Get("tokenizer.ggml.tokens").([]string)
	if len(tokens) != VocabSize || h.Get("llama.vocab_size") != uint32(VocabSize) {
		t.Fatalf("%d tokens, vocab_size %v, want %d", len(tokens), h.Get("llama.vocab_size"), VocabSize)
	}
	seen := map[string]bool{}
	for b, tok := range tokens[:256] {
		if utf8.RuneCountInString(tok) != 1 || seen[tok] {
			t.Fatalf("token %d is %q: not one character, or seen before", b, tok)
		}
		seen[tok] = true
	}
	if tokens['A'] != "A" || tokens[' '] != "Ġ" || tokens['\n'] != "Ċ" {
		t.Fatalf("tokens A, space, newline are %q %q %q, want GPT-2's A Ġ Ċ", tokens['A'], tokens[' '], tokens['\n'])
	}
	if h.Get("tokenizer.ggml.model") != "gpt2" || h.Get("tokenizer.ggml.bos_token_id") != uint32(TokenBOS) || h.Get("tokenizer.ggml.eos_token_id") != uint32(TokenEOS) {
		t.Fatal("tokenizer model, BOS or EOS not as declared")
	}
}

func TestValidate(t *testing.T) {
	for name, mod := range map[string]func(*Llama){
		"zero layers": func(l *Llama) { l.Layers = 0 },
		"heads":       func(l *Llama) { l.Heads = 3 },
		"kv heads":    func(l *Llama) { l.KVHeads = 3 },
		"odd head":    func(l *Llama) { l.Embed, l.Heads, l.KVHeads = 12, 4, 4 },
	} {
		l := Tiny
		mod(&l)
		if _, err := l.File(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := GenerateLlama(t.TempDir(), "huge"); err == nil || !strings.Contains(err.Error(), "tiny") {
		t.Errorf("unknown size: %v, want an error naming the sizes", err)
	}
}

// TestGenerateLlama: the file is written once; a second call leaves a correct file
// alone and rewrites a damaged one.
func TestGenerateLlama(t *testing.T) {
	dir := t.TempDir()
	path, err := GenerateLlama(dir, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, "llm-tiny.gguf") {
		t.Fatalf("path %s", path)
	}
	hashFile := func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	if got := hashFile(); got != tinySHA256 {
		t.Fatalf("file's sha256 %s, want %s", got, tinySHA256)
	}
	st1, _ := os.Stat(path)
	if _, err := GenerateLlama(dir, "tiny"); err != nil {
		t.Fatal(err)
	}
	if st2, _ := os.Stat(path); !os.SameFile(st1, st2) {
		t.Fatal("a correct file was rewritten")
	}
	if err := os.Truncate(path, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := GenerateLlama(dir, "tiny"); err != nil {
		t.Fatal(err)
	}
	if got := hashFile(); got != tinySHA256 {
		t.Fatalf("a truncated file was not regenerated: sha256 %s", got)
	}
}
