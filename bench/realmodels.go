package bench

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/npy"
)

// The real (fetched, not generated) models the benches use: the PP-OCRv4 detector
// (throughput; the real collision scenario's interactive class) and Silero VAD v5 (the
// real collision scenario's audio streams). Each lives under <repo>/.deps and is fetched
// by its script when missing.

// ocrDir is the PP-OCRv4 detector's folder, fetched by scripts/fetch-ocr-model.sh when
// it is not there yet.
func (o *Options) ocrDir() (string, error) {
	return o.fetchedModel(filepath.Join("ocr", "ppocrv4-det"), "fetch-ocr-model.sh")
}

// vadDir is Silero VAD v5's folder, fetched by scripts/fetch-vad-model.sh when it is not
// there yet.
func (o *Options) vadDir() (string, error) {
	return o.fetchedModel(filepath.Join("vad", "silero-v5"), "fetch-vad-model.sh")
}

// fetchedModel is <repo>/.deps/<sub>, holding model.onnx, after running scripts/<script>
// .deps when the model is not there.
func (o *Options) fetchedModel(sub, script string) (string, error) {
	dir := filepath.Join(o.Repo, ".deps", sub)
	if isFile(filepath.Join(dir, "model.onnx")) {
		return dir, nil
	}
	path := filepath.Join(o.Repo, "scripts", script)
	cmd := exec.Command(path, filepath.Join(o.Repo, ".deps"))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s is missing and %s failed (%v)", filepath.Join(dir, "model.onnx"), path, err)
	}
	return dir, nil
}

// ocrInput is a deterministic noise image of side x side for the detector.
func ocrInput(side int) *codec.Tensor {
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 3*side*side)
	for i := range x {
		x[i] = float32(rng.Float64()*2 - 1)
	}
	return &codec.Tensor{Type: "float32", Shape: []int64{1, 3, int64(side), int64(side)}, Data: codec.Float32Bytes(x)}
}

// ocrPath is the detector at side x side by path: its input, a noise image (ocrInput),
// written once as a .npy in the image root; each request names that file (input_paths)
// and a fresh output .npy in the spool (output_paths). The client then reads each output
// whole, checks its size and removes it (after, checkOutput).
type ocrPath struct {
	x          *codec.Tensor
	xPath      string
	inputBytes int
	// outputBytes is the size of an output file: the .npy of [1,1,side,side] float32.
	outputBytes int64
	spool       string
}

// newOCRPath writes the input file into w's image root (w.spool() must exist before the
// first request is served).
func newOCRPath(w *workdir, side int) (*ocrPath, error) {
	x := ocrInput(side)
	p := &ocrPath{x: x, xPath: filepath.Join(w.images, fmt.Sprintf("ocr-x-%d.npy", side)), spool: w.spool()}
	b, err := npy.Encode(x)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.xPath, b, 0o644); err != nil {
		return nil, err
	}
	p.inputBytes = len(b)
	hdr, err := npy.HeaderOf(&codec.Tensor{Type: "float32", Shape: []int64{1, 1, int64(side), int64(side)}, Data: make([]byte, 4*side*side)})
	if err != nil {
		return nil, err
	}
	p.outputBytes = int64(len(hdr)) + 4*int64(side)*int64(side)
	return p, nil
}

// request is one request of the detector called model, by path, with a new output file.
func (p *ocrPath) request(model string) codec.Request {
	return codec.Request{Model: model, InputPaths: map[string]string{ocrInputName: p.xPath},
		OutputPaths: map[string]string{ocrOutputName: filepath.Join(p.spool, "y-"+nuid.Next()+".npy")}}
}

// after is what the client does with a reply: read the output file it names whole,
// check its size and remove it.
func (p *ocrPath) after(r *codec.InferReply) error {
	path, ok := r.OutputPaths[ocrOutputName]
	if !ok {
		return fmt.Errorf("the reply names no file for output %s (output_paths %v)", ocrOutputName, r.OutputPaths)
	}
	return p.checkOutput(path)
}

// checkOutput reads an output file whole, checks its size and removes it.
func (p *ocrPath) checkOutput(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if int64(len(data)) != p.outputBytes {
		return fmt.Errorf("%s is %d bytes, want %d", path, len(data), p.outputBytes)
	}
	return os.Remove(path)
}

// checkSpool checks and removes every output file in the spool (after a run whose
// replies were not read one by one): it returns how many were whole and the first
// problem.
func (p *ocrPath) checkSpool() (int, error) {
	entries, err := os.ReadDir(p.spool)
	if err != nil {
		return 0, err
	}
	n := 0
	var first error
	for _, e := range entries {
		if err := p.checkOutput(filepath.Join(p.spool, e.Name())); err != nil {
			if first == nil {
				first = err
			}
			os.Remove(filepath.Join(p.spool, e.Name()))
			continue
		}
		n++
	}
	return n, first
}
