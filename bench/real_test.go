package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/npy"
)

// TestOCRPath: the by-path detector helper writes its input once, names a new output
// file per request, and takes an output file of the right size (and only that).
func TestOCRPath(t *testing.T) {
	dir := t.TempDir()
	w := &workdir{dir: dir, images: filepath.Join(dir, "images")}
	if err := os.MkdirAll(w.spool(), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := newOCRPath(w, 32)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p.xPath); err != nil || st.Size() != int64(p.inputBytes) {
		t.Fatalf("input file: %v %v", st, err)
	}
	a, b := p.request("m"), p.request("m")
	if a.InputPaths[ocrInputName] != p.xPath || a.OutputPaths[ocrOutputName] == b.OutputPaths[ocrOutputName] {
		t.Fatalf("requests %+v %+v", a, b)
	}
	out, err := npy.Encode(&codec.Tensor{Type: "float32", Shape: []int64{1, 1, 32, 32}, Data: make([]byte, 4*32*32)})
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(out)) != p.outputBytes {
		t.Fatalf("outputBytes %d, a real output file is %d", p.outputBytes, len(out))
	}
	good, bad := a.OutputPaths[ocrOutputName], b.OutputPaths[ocrOutputName]
	os.WriteFile(good, out, 0o644)
	os.WriteFile(bad, out[:100], 0o644)
	if err := p.after(&codec.InferReply{OutputPaths: map[string]string{ocrOutputName: good}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(good); !os.IsNotExist(err) {
		t.Fatal("output not removed")
	}
	if n, err := p.checkSpool(); n != 0 || err == nil {
		t.Fatalf("checkSpool of a short file: %d, %v", n, err)
	}
}
