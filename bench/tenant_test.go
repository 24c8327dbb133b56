package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"testing"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// tinyDecoder is a decoder small enough for a test: 2 blocks of width 64.
var tinyDecoder = onnxgen.DecoderSpec{Layers: 2, Width: 64, FF: 128, Vocab: 256, MaxPos: 1024}

// TestTenant runs the LLM tenant's loop on a tiny decoder in this process: the ready line,
// then after the start line prompt lines (a prefill and a step per token) and the summary,
// whose figures agree with the prompts'. The same prompts give the same tokens (greedy
// decoding of a deterministic model).
func TestTenant(t *testing.T) {
	lib := testenv.RuntimeLib(t, RuntimeVersion)
	dir := t.TempDir()
	if err := onnxgen.GenerateDecoder(dir, tinyDecoder); err != nil {
		t.Fatal(err)
	}
	run := func() []map[string]any {
		var out, errb bytes.Buffer
		// The start line, and stdin left open: -duration ends the run.
		r, w := io.Pipe()
		defer w.Close()
		go w.Write([]byte("go\n"))
		code := TenantMain([]string{"-lib", lib, "-model", dir, "-prompt", "48", "-tokens", "6", "-duration", "300ms"}, r, &out, &errb)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		var lines []map[string]any
		sc := bufio.NewScanner(&out)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			lines = append(lines, m)
		}
		return lines
	}
	lines := run()
	if len(lines) < 3 || lines[0]["event"] != "ready" || lines[len(lines)-1]["event"] != "done" {
		t.Fatalf("want ready, prompts, done; got %v", lines)
	}
	if lines[0]["layers"] != 2.0 || lines[0]["width"] != 64.0 || lines[0]["vocab"] != 256.0 {
		t.Errorf("ready line %v: want the model's shape (2 layers, width 64, vocab 256)", lines[0])
	}
	prompts := lines[1 : len(lines)-1]
	done := lines[len(lines)-1]
	if done["prompts"] != float64(len(prompts)) || done["tokens"] != float64(6*len(prompts)) || done["tokens_per_s"].(float64) <= 0 {
		t.Errorf("summary %v does not match %d prompts of 6 tokens", done, len(prompts))
	}
	for _, p := range prompts {
		if p["event"] != "prompt" || p["tokens"] != 6.0 || p["prompt_tokens"] != 48.0 || p["first_token_ms"].(float64) <= 0 {
			t.Errorf("prompt line %v", p)
		}
	}
	if again := run(); again[1]["last_token"] != prompts[0]["last_token"] {
		t.Errorf("the same first prompt generated %v then %v", prompts[0]["last_token"], again[1]["last_token"])
	}
}
