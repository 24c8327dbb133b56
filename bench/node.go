package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/npy"
)

// The onnxruntime-node baseline of the throughput bench: bench/node/throughput.mjs run
// under Bun (the runtime of the app ortbus replaces), loading onnxruntime-node in its own
// process, one chunk per run (load, warm-up, measure, one JSON line; see the script).
// scripts/fetch-node-bench.sh (`make node-bench`) installs onnxruntime-node into
// <repo>/.deps/node-bench and Bun into clients/ts/node_modules; without them the bench
// skips these paths and says so.

// NodeBenchVersion is the onnxruntime-node version bench/node/package-lock.json pins (the
// same ONNX Runtime as RuntimeVersion).
const NodeBenchVersion = "1.30.0"

// nodeBench is an installed baseline: the Bun executable, the runner script and the
// node_modules holding onnxruntime-node.
type nodeBench struct {
	bun, script, modules string
}

// errNodeBenchMissing wraps what findNodeBench finds missing.
var errNodeBenchMissing = errors.New("the onnxruntime-node baseline is not installed: run `make node-bench`")

// findNodeBench finds the installed baseline under o.Repo (resolved).
func findNodeBench(o *Options) (*nodeBench, error) {
	nb := &nodeBench{
		bun:     filepath.Join(o.Repo, "clients", "ts", "node_modules", "bun", "bin", "bun.exe"),
		script:  filepath.Join(o.Repo, "bench", "node", "throughput.mjs"),
		modules: filepath.Join(o.Repo, ".deps", "node-bench", "node_modules"),
	}
	for _, p := range []string{nb.script, filepath.Join(nb.modules, "onnxruntime-node", "package.json"), filepath.Join(o.Repo, ".deps", "node-bench", "INSTALLED"), nb.bun} {
		if !isFile(p) {
			return nil, fmt.Errorf("%w (%s is missing)", errNodeBenchMissing, p)
		}
	}
	return nb, nil
}

// nodeChunk is the runner's line: one chunk of one path.
type nodeChunk struct {
	Items     int     `json:"items"`
	Seconds   float64 `json:"seconds"`
	CPUS      float64 `json:"cpu_s"`
	WarmItems int     `json:"warm_items"`
	LoadS     float64 `json:"load_s"`
	Runtime   string  `json:"runtime"`
	Version   string  `json:"onnxruntime_node"`
	Threads   int     `json:"threads"`
	Spin      string  `json:"spin"`
	// EP is the execution provider the session was created with (the only one in its
	// list: creation fails rather than fall back); FirstMS the first call's time, made
	// before the warm-up with a GPU EP (its shader compilation).
	EP      string  `json:"ep"`
	FirstMS float64 `json:"first_ms,omitempty"`
}

// nodeInput is one input of a model for the baseline: the tensor, written as a .npy.
type nodeInput struct {
	name string
	x    *codec.Tensor
}

// writeNodeInputs writes m's baseline inputs as .npy files into dir and returns the
// runner's -input flags (NAME=FILE).
func writeNodeInputs(dir, model string, ins []nodeInput) ([]string, error) {
	var flags []string
	for _, in := range ins {
		b, err := npy.Encode(in.x)
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, fmt.Sprintf("node-%s-%s.npy", model, in.name))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return nil, err
		}
		flags = append(flags, in.name+"="+p)
	}
	return flags, nil
}

// run runs one chunk: model (an .onnx file) on inputs (-input flags) with threads intra-op
// threads, ONNX Runtime's spinning at its default (spin) or off, on the execution provider
// ep (cpu, or webgpu: a first call, then the warm-up), warm of unmeasured calls, then
// phase counted.
func (nb *nodeBench) run(ctx context.Context, model string, inputs []string, threads int, spin bool, ep string, warm, phase time.Duration) (nodeChunk, error) {
	s := "off"
	if spin {
		s = "default"
	}
	args := []string{nb.script, "-modules", nb.modules, "-model", model, "-threads", fmt.Sprint(threads), "-spin", s,
		"-warm", fmt.Sprint(warm.Milliseconds()), "-duration", fmt.Sprint(phase.Milliseconds())}
	if ep != "" && ep != "cpu" {
		args = append(args, "-ep", ep)
	}
	for _, in := range inputs {
		args = append(args, "-input", in)
	}
	cctx, cancel := context.WithTimeout(ctx, warm+phase+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, nb.bun, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nodeChunk{}, fmt.Errorf("%s %s: %v: %s", filepath.Base(nb.bun), filepath.Base(nb.script), err, lastLines(stderr.String(), 5))
	}
	return parseNodeChunk(stdout.Bytes())
}

// parseNodeChunk reads the runner's last output line.
func parseNodeChunk(out []byte) (nodeChunk, error) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var c nodeChunk
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &c); err != nil {
		return nodeChunk{}, fmt.Errorf("the onnxruntime-node runner printed %q: %v", lastLines(string(out), 3), err)
	}
	if c.Seconds <= 0 || c.Runtime == "" {
		return nodeChunk{}, fmt.Errorf("the onnxruntime-node runner printed %q: no measurement", lastLines(string(out), 3))
	}
	return c, nil
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
