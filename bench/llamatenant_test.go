package bench

import (
	"strings"
	"testing"
)

// TestLlamaPlan: a llama [tenant]'s defaults (model tiny, gpu auto, the context) and the
// keys it refuses; the onnx engine refuses the llama keys.
func TestLlamaPlan(t *testing.T) {
	p := &TenantPlan{Engine: engineLlama, Prompt: 600, Tokens: 32}
	if err := p.check(); err != nil {
		t.Fatal(err)
	}
	if p.Model != "tiny" || p.GPU != "auto" || p.Context != 633 || p.GateTarget != "interactive" || p.Count != 1 || p.Device != "cpu" {
		t.Fatalf("defaults %+v", p)
	}
	for _, bad := range []TenantPlan{
		{Engine: engineLlama, Prompt: 64, Tokens: 8, Model: "huge"},
		{Engine: engineLlama, Prompt: 64, Tokens: 8, GPU: "metal"},
		{Engine: engineLlama, Prompt: 64, Tokens: 8, Layers: 2},
		{Engine: engineLlama, Prompt: 64, Tokens: 8, Context: 64},
		{Engine: engineLlama, Prompt: 4000, Tokens: 200},
		{Engine: engineLlama, Prompt: 1, Tokens: 8},
		{Engine: engineONNX, Prompt: 64, Tokens: 8, Model: "tiny"},
		{Engine: "vllm", Prompt: 64, Tokens: 8},
		{Engine: engineLlama, Prompt: 64, Tokens: 8, GateTarget: "someone"},
	} {
		if err := bad.check(); err == nil {
			t.Errorf("plan %+v accepted", bad)
		}
	}
}

// TestLlamaBackend: auto is Vulkan where a GPU is found, the CPU without one (saying
// why: lavapipe's shader compilation); an explicit backend is kept.
func TestLlamaBackend(t *testing.T) {
	if b, why := llamaBackend("auto", &GPUCollision{GPU: GPU{Device: "cuda:0", What: "NVIDIA H200 (nvidia-smi)"}}); b != "vulkan" || !strings.Contains(why, "H200") {
		t.Errorf("with a GPU: %s (%s)", b, why)
	}
	if b, why := llamaBackend("auto", &GPUCollision{GPU: GPU{What: "no NVIDIA GPU"}}); b != "cpu" || !strings.Contains(why, "lavapipe") {
		t.Errorf("without a GPU: %s (%s)", b, why)
	}
	if b, _ := llamaBackend("auto", nil); b != "cpu" {
		t.Errorf("no GPU scenario: %s", b)
	}
	if b, _ := llamaBackend("cuda", nil); b != "cuda" {
		t.Errorf("explicit: %s", b)
	}
}

// TestLlamaPrompt: a prompt of n tokens is n-1 bytes (BOS is the n-th), the same each
// time.
func TestLlamaPrompt(t *testing.T) {
	for _, n := range []int{2, 128, 1024, 3000} {
		if p := llamaPrompt(n); len(p) != n-1 || p != llamaPrompt(n) {
			t.Errorf("llamaPrompt(%d) is %d bytes", n, len(p))
		}
	}
}

// TestGateLog: the wrapper's pause lines are counted however the writes cut them, other
// lines are not, and everything goes on to the tee.
func TestGateLog(t *testing.T) {
	var tee strings.Builder
	g := &gateLog{tee: &tee}
	text := "llama.cpp: loaded\n" + gatePausedLine + "1 (urgent work on gpu:0)\nortbus lease: gate: resumed\n" + gatePausedLine + "2\nno " + gatePausedLine + "3\n"
	for i := 0; i < len(text); i += 7 {
		g.Write([]byte(text[i:min(i+7, len(text))]))
	}
	if g.pauses() != 2 || tee.String() != text {
		t.Fatalf("%d pauses (want 2), tee %q", g.pauses(), tee.String())
	}
	g.Write([]byte(strings.Repeat("x", 5000)))
	g.Write([]byte("\n" + gatePausedLine + "4\n"))
	if g.pauses() != 3 {
		t.Fatalf("after a long line: %d pauses, want 3", g.pauses())
	}
}
