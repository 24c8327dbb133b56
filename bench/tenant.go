package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"time"

	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

// The LLM-shaped tenant: a process ortbus does not run (`ortbus bench llm-tenant`, run
// under `ortbus lease`) that answers long-context prompts with the generated decoder
// (onnxgen.DecoderGraph) through ONNX Runtime, as a local LLM server would: for each
// prompt a prefill of its tokens in one call, then one call per generated token (greedy,
// the key/value cache carried from call to call). It prints JSON lines on stdout:
//
//	{"event":"ready", ...}            the model is loaded; it then waits for a line on stdin
//	{"event":"prompt", ...}           each prompt answered (TenantPrompt)
//	{"event":"done", ...}             at the end (TenantSummary)
//
// It answers prompts back to back from the line on stdin until -duration has passed or
// stdin closes (a prompt cut off by the end is not counted).

// TenantPrompt is one prompt's figures: first_token_ms from the prompt's start to its
// first generated token (the prefill and one argmax), decode_tokens_per_s the tokens
// generated after the first over the time they took.
type TenantPrompt struct {
	Event            string  `json:"event"`
	N                int     `json:"n"`
	StartUnixMS      int64   `json:"start_unix_ms"`
	PromptTokens     int     `json:"prompt_tokens"`
	Tokens           int     `json:"tokens"`
	FirstTokenMS     float64 `json:"first_token_ms"`
	DecodeMS         float64 `json:"decode_ms"`
	DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	LastToken        int64   `json:"last_token"`
}

// TenantSummary is the tenant's last line: prompts answered, their tokens, and decode
// tokens/s over all of them (tokens after the first / decode time).
type TenantSummary struct {
	Event      string  `json:"event"`
	Prompts    int     `json:"prompts"`
	Tokens     int     `json:"tokens"`
	DecodeS    float64 `json:"decode_s"`
	TokensPerS float64 `json:"tokens_per_s"`
	FirstP50MS float64 `json:"first_token_p50_ms"`
	FirstP95MS float64 `json:"first_token_p95_ms"`
	ElapsedS   float64 `json:"elapsed_s"`
}

// TenantMain is `ortbus bench llm-tenant FLAGS`: it returns the exit status.
func TenantMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench llm-tenant", flag.ContinueOnError)
	fs.SetOutput(stderr)
	lib := fs.String("lib", "", "libonnxruntime.so path")
	dir := fs.String("model", "", "the decoder's folder (decoder.onnx)")
	prompt := fs.Int("prompt", 512, "prompt tokens")
	tokens := fs.Int("tokens", 64, "tokens generated per prompt")
	threads := fs.Int("threads", 1, "intra-op threads")
	duration := fs.Duration("duration", 10*time.Second, "answer prompts for this long after the start line")
	seed := fs.Uint64("seed", 1, "the prompts' tokens")
	if fs.Parse(args) != nil || fs.NArg() != 0 || *lib == "" || *dir == "" || *prompt <= 0 || *tokens <= 0 || *prompt+*tokens > onnxgen.DefaultDecoder.MaxPos {
		fmt.Fprintln(stderr, "usage: ortbus bench llm-tenant -lib LIB -model DIR [-prompt 512] [-tokens 64] [-threads 1] [-duration 10s] [-seed 1]; prompt + tokens <= 2048")
		return 2
	}
	t, err := newTenant(*lib, filepath.Join(*dir, onnxgen.DecoderFile), *threads)
	if err != nil {
		fmt.Fprintln(stderr, "llm-tenant:", err)
		return 1
	}
	defer t.close()
	enc := json.NewEncoder(stdout)
	enc.Encode(map[string]any{"event": "ready", "layers": t.spec.Layers, "width": t.spec.Width, "vocab": t.spec.Vocab, "prompt": *prompt, "tokens": *tokens, "threads": *threads})
	br := bufio.NewReader(stdin)
	if _, err := br.ReadString('\n'); err != nil {
		fmt.Fprintln(stderr, "llm-tenant: no start line:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	go func() {
		io.Copy(io.Discard, br) // stdin closed: stop
		cancel()
	}()
	sum := TenantSummary{Event: "done"}
	var firsts []time.Duration
	var decode time.Duration
	t0 := time.Now()
	rng := rand.New(rand.NewPCG(*seed, 7))
	for n := 0; ctx.Err() == nil; n++ {
		p, err := t.answer(ctx, rng, n, *prompt, *tokens)
		if err != nil {
			if ctx.Err() != nil {
				break // cut off by the end
			}
			fmt.Fprintln(stderr, "llm-tenant:", err)
			return 1
		}
		enc.Encode(p)
		sum.Prompts++
		sum.Tokens += p.Tokens
		firsts = append(firsts, time.Duration(p.FirstTokenMS*float64(time.Millisecond)))
		decode += time.Duration(p.DecodeMS * float64(time.Millisecond))
	}
	s := summarize(firsts)
	sum.FirstP50MS, sum.FirstP95MS = ms(s.P50), ms(s.P95)
	sum.DecodeS = round(decode.Seconds(), 3)
	if decode > 0 {
		sum.TokensPerS = round(float64(sum.Tokens-sum.Prompts)/decode.Seconds(), 2)
	}
	sum.ElapsedS = round(time.Since(t0).Seconds(), 3)
	enc.Encode(sum)
	return 0
}

// tenant is the decoder loaded in one session.
type tenant struct {
	rt   *ort.Runtime
	sess *ort.Session
	spec onnxgen.DecoderSpec
}

func newTenant(lib, model string, threads int) (*tenant, error) {
	rt, err := ort.Load(lib)
	if err != nil {
		return nil, err
	}
	sess, err := rt.NewSession(model, ort.SessionConfig{IntraOpThreads: max(1, threads), InterOpThreads: 1})
	if err != nil {
		rt.Close()
		return nil, err
	}
	t := &tenant{rt: rt, sess: sess}
	// The shape, from the model's own inputs and outputs.
	for _, in := range sess.Inputs {
		if in.Name == "past_k_0" && len(in.Shape) == 3 {
			t.spec.Width = int(in.Shape[2])
		}
		var l int
		if _, err := fmt.Sscanf(in.Name, "past_k_%d", &l); err == nil {
			t.spec.Layers = max(t.spec.Layers, l+1)
		}
	}
	for _, out := range sess.Outputs {
		if out.Name == "logits" && len(out.Shape) == 3 {
			t.spec.Vocab = int(out.Shape[2])
		}
	}
	if t.spec.Layers == 0 || t.spec.Width <= 0 || t.spec.Vocab <= 1 {
		t.close()
		return nil, fmt.Errorf("%s is not an onnxgen decoder (inputs %v)", model, sess.Inputs)
	}
	return t, nil
}

func (t *tenant) close() {
	t.sess.Close()
	t.rt.Close()
}

// answer runs one prompt of prompt random tokens: the prefill, then tokens-1 steps.
func (t *tenant) answer(ctx context.Context, rng *rand.Rand, n, prompt, tokens int) (*TenantPrompt, error) {
	start := time.Now()
	ids := make([]int64, prompt)
	pos := make([]int64, prompt)
	for i := range ids {
		ids[i], pos[i] = rng.Int64N(int64(t.spec.Vocab)), int64(i)
	}
	// The past starts as one zero slot, masked out (column 0), then causal.
	w := t.spec.Width
	k := make([][]float32, t.spec.Layers)
	v := make([][]float32, t.spec.Layers)
	for l := range k {
		k[l], v[l] = make([]float32, w), make([]float32, w)
	}
	past := 1
	mask := make([]float32, prompt*(prompt+1))
	for i := range prompt {
		row := mask[i*(prompt+1):]
		row[0] = -1e9
		for j := i + 2; j <= prompt; j++ {
			row[j] = -1e9
		}
	}
	next, err := t.run(ctx, ids, pos, mask, k, v, &past)
	if err != nil {
		return nil, err
	}
	first := time.Since(start)
	p := &TenantPrompt{Event: "prompt", N: n, StartUnixMS: start.UnixMilli(), PromptTokens: prompt, Tokens: 1, FirstTokenMS: ms(first)}
	for i := 1; i < tokens; i++ {
		step := make([]float32, past+1)
		step[0] = -1e9
		next, err = t.run(ctx, []int64{next}, []int64{int64(prompt + i - 1)}, step, k, v, &past)
		if err != nil {
			return nil, err
		}
		p.Tokens++
	}
	decode := time.Since(start) - first
	p.DecodeMS = ms(decode)
	if p.Tokens > 1 && decode > 0 {
		p.DecodeTokensPerS = round(float64(p.Tokens-1)/decode.Seconds(), 2)
	}
	p.LastToken = next
	return p, nil
}

// run is one call: T tokens after the past (k, v: each layer's [past, width], replaced
// by the presents); it returns the greedy next token.
func (t *tenant) run(ctx context.Context, ids, pos []int64, mask []float32, k, v [][]float32, past *int) (int64, error) {
	T := int64(len(ids))
	w := int64(t.spec.Width)
	in := []ort.Tensor{
		{Name: "ids", Shape: []int64{1, T}, Data: ids},
		{Name: "pos", Shape: []int64{1, T}, Data: pos},
		{Name: "mask", Shape: []int64{T, int64(*past) + T}, Data: mask},
	}
	for l := range k {
		in = append(in, ort.Tensor{Name: fmt.Sprintf("past_k_%d", l), Shape: []int64{1, int64(*past), w}, Data: k[l]},
			ort.Tensor{Name: fmt.Sprintf("past_v_%d", l), Shape: []int64{1, int64(*past), w}, Data: v[l]})
	}
	outs, err := t.sess.Run(ctx, in)
	if err != nil {
		return 0, err
	}
	var next int64
	for _, o := range outs {
		var l int
		switch {
		case o.Name == "logits":
			best := float32(math.Inf(-1))
			for i, x := range o.Float32() {
				if x > best {
					best, next = x, int64(i)
				}
			}
		case scan(o.Name, "present_k_%d", &l):
			k[l] = o.Float32()
		case scan(o.Name, "present_v_%d", &l):
			v[l] = o.Float32()
		}
	}
	*past += int(T)
	return next, nil
}

func scan(s, format string, l *int) bool {
	_, err := fmt.Sscanf(s, format, l)
	return err == nil
}
