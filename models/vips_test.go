package models

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
	"github.com/ortbus/ortbus/ort"
)

const (
	vipsEnvLib    = "ORTBUS_VIPS_KINDS_LIB"
	vipsEnvModels = "ORTBUS_VIPS_KINDS_MODELS"
)

// TestLibvipsKinds checks every image kind on the generated models, in a child process
// (one ONNX Runtime per process): on upright images, libvips's answers stay within
// tolerance of the previous Go decode path's (tag scores ±0.02, embedding cosine ≥ 0.99,
// box IoU ≥ 0.9); a photo stored sideways with EXIF orientation 6 answers as its upright
// copy (boxes and the segment mask in the displayed frame).
func TestLibvipsKinds(t *testing.T) {
	testenv.RequireVips(t)
	testenv.RunChild(t, "TestLibvipsKindsChild", vipsEnvLib+"="+testenv.RuntimeLib(t, "1.30.0"), vipsEnvModels+"="+testenv.Models(t))
}

// photo is w×h RGB: a blue-grey gradient (no red: the generated detector looks for red),
// a saturated red rectangle over x in [0.30w, 0.55w), y in [0.20h, 0.70h), and a pale
// disc.
func photo(w, h int) []byte {
	pix := make([]byte, 0, 3*w*h)
	for y := range h {
		for x := range w {
			p := [3]byte{40, byte(80 + y*100/h), byte(120 + x*100/w)}
			if x >= w*30/100 && x < w*55/100 && y >= h*20/100 && y < h*70/100 {
				p = [3]byte{255, 0, 0}
			} else if math.Hypot(float64(x-w*3/4), float64(y-h/3)) < float64(h)/6 {
				p = [3]byte{230, 220, 200}
			}
			pix = append(pix, p[:]...)
		}
	}
	return pix
}

func rotateCW(pix []byte, w, h int) []byte {
	out := make([]byte, len(pix))
	for y := range w {
		for x := range h {
			s, d := 3*((h-1-x)*w+y), 3*(y*h+x)
			copy(out[d:d+3], pix[s:s+3])
		}
	}
	return out
}

func iou(a, b codec.Box) float64 {
	ix := math.Max(0, math.Min(float64(a.X2), float64(b.X2))-math.Max(float64(a.X1), float64(b.X1)))
	iy := math.Max(0, math.Min(float64(a.Y2), float64(b.Y2))-math.Max(float64(a.Y1), float64(b.Y1)))
	in := ix * iy
	u := float64((a.X2-a.X1)*(a.Y2-a.Y1)+(b.X2-b.X1)*(b.Y2-b.Y1)) - in
	if u <= 0 {
		return 0
	}
	return in / u
}

func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

func TestLibvipsKindsChild(t *testing.T) {
	if !testenv.InChild("TestLibvipsKindsChild") {
		t.Skip("runs only as a child of TestLibvipsKinds")
	}
	lib := testenv.RequireVips(t)
	rt, err := ort.Load(os.Getenv(vipsEnvLib))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv(vipsEnvModels)
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	spool := filepath.Join(root, "spool")
	if err := os.Mkdir(spool, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, pix []byte, w, h, bands int, suffix string, orientation int) string {
		t.Helper()
		b, err := lib.Encode(pix, w, h, bands, suffix, "", orientation)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const pw, ph = 1600, 1200
	pic := photo(pw, ph)
	upright := []string{write("photo.jpg", pic, pw, ph, 3, ".jpg[Q=92]", 0)}
	// An illustration with transparent margins: alpha flattened on white by both paths.
	const iw, ih = 900, 700
	ill := photo(iw, ih)
	rgba := make([]byte, 0, iw*ih*4)
	for i := 0; i < len(ill); i += 3 {
		x, y := (i/3)%iw, (i/3)/iw
		a := byte(255)
		if x < iw/10 || y > ih*9/10 {
			a = 0
		}
		rgba = append(rgba, ill[i], ill[i+1], ill[i+2], a)
	}
	upright = append(upright, write("illustration.png", rgba, iw, ih, 4, ".png", 0))
	sideways := write("sideways.jpg", pic, pw, ph, 3, ".jpg[Q=92]", 6)
	turned := write("turned.jpg", rotateCW(pic, pw, ph), ph, pw, 3, ".jpg[Q=92]", 0)

	open := func(t *testing.T, kind, sub string, reference bool) Model {
		t.Helper()
		env := Env{Runtime: rt, SpoolDir: spool, Images: images.Policy{AllowedRoots: []string{root}, OutputRoots: []string{spool}, Reference: reference}}
		m, err := Open(env, &config.Model{Name: kind, Kind: kind, Dir: filepath.Join(dir, sub)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	ask := func(t *testing.T, m Model, op, path string, req codec.Request) codec.Replier {
		t.Helper()
		req.Path = path
		it, err := m.Prepare(op, &codec.WorkItem{Request: req, Op: op})
		if err != nil {
			t.Fatalf("%s %s: %v", op, path, err)
		}
		replies, errs := m.Run(context.Background(), op, []Item{it})
		if errs[0] != nil {
			t.Fatalf("%s %s: %v", op, path, errs[0])
		}
		return replies[0]
	}
	zero := 0.0
	all := codec.Request{Thresholds: &codec.Thresholds{General: &zero, Character: &zero}}

	t.Run("tagger", func(t *testing.T) {
		v, g := open(t, config.KindTaggerPixAI, onnxgen.TaggerDir, false), open(t, config.KindTaggerPixAI, onnxgen.TaggerDir, true)
		for _, p := range upright {
			a, b := ask(t, v, "tag", p, all).(*codec.TagReply), ask(t, g, "tag", p, all).(*codec.TagReply)
			for _, pair := range [][2]map[string]float32{{a.General, b.General}, {a.Character, b.Character}, {a.Rating, b.Rating}} {
				if len(pair[0]) != len(pair[1]) || len(pair[1]) == 0 {
					t.Fatalf("%s: %d scores from libvips, %d from Go", p, len(pair[0]), len(pair[1]))
				}
				for k, s := range pair[1] {
					if d := math.Abs(float64(pair[0][k] - s)); d > 0.02 {
						t.Errorf("%s: %s scores %.4f with libvips, %.4f with Go", p, k, pair[0][k], s)
					}
				}
			}
		}
	})
	t.Run("oppai", func(t *testing.T) {
		v, g := open(t, config.KindTaggerOppai, onnxgen.OppaiDir, false), open(t, config.KindTaggerOppai, onnxgen.OppaiDir, true)
		for _, p := range upright {
			a, b := ask(t, v, "tag", p, all).(*codec.TagReply), ask(t, g, "tag", p, all).(*codec.TagReply)
			if len(a.General) != len(b.General) || len(b.General) == 0 {
				t.Fatalf("%s: %d general tags from libvips, %d from Go", p, len(a.General), len(b.General))
			}
			for k, s := range b.General {
				if d := math.Abs(float64(a.General[k] - s)); d > 0.02 {
					t.Errorf("%s: %s scores %.4f with libvips, %.4f with Go", p, k, a.General[k], s)
				}
			}
		}
	})
	t.Run("ccip", func(t *testing.T) {
		v, g := open(t, config.KindCCIP, onnxgen.CCIPDir, false), open(t, config.KindCCIP, onnxgen.CCIPDir, true)
		for _, p := range upright {
			a, b := ask(t, v, "embed", p, codec.Request{}).(*codec.EmbedReply), ask(t, g, "embed", p, codec.Request{}).(*codec.EmbedReply)
			if c := cosine(a.Embedding, b.Embedding); c < 0.99 || math.IsNaN(c) {
				t.Errorf("%s: cosine %.5f between libvips's and Go's embeddings", p, c)
			}
		}
	})
	t.Run("detect", func(t *testing.T) {
		v, g := open(t, config.KindDetect, onnxgen.DetectorDir, false), open(t, config.KindDetect, onnxgen.DetectorDir, true)
		box := func(m Model, p string) codec.Box {
			t.Helper()
			r := ask(t, m, "detect", p, codec.Request{}).(*codec.DetectReply)
			if len(r.Boxes) != 1 {
				t.Fatalf("%s: %d boxes %+v, want the red rectangle's", p, len(r.Boxes), r.Boxes)
			}
			return r.Boxes[0]
		}
		for _, p := range upright {
			a, b := box(v, p), box(g, p)
			if x := iou(a, b); x < 0.9 {
				t.Errorf("%s: IoU %.3f between libvips's box %+v and Go's %+v", p, x, a, b)
			}
		}
		// The red rectangle of the 1600×1200 photo, displayed upright (1200×1600).
		want := codec.Box{X1: float32(ph - ph*70/100), Y1: pw * 30 / 100, X2: float32(ph - ph*20/100), Y2: pw * 55 / 100}
		for _, p := range []string{sideways, turned} {
			if b := box(v, p); iou(b, want) < 0.9 {
				t.Errorf("%s: box %+v, want about %+v (the displayed frame)", p, b, want)
			}
		}
	})
	t.Run("segment", func(t *testing.T) {
		v := open(t, config.KindSegment, onnxgen.SegmenterDir, false)
		for _, p := range []string{sideways, turned} {
			r := ask(t, v, "segment", p, codec.Request{}).(*codec.SegmentReply)
			if r.Width != ph || r.Height != pw {
				t.Errorf("%s: mask %dx%d, want the upright %dx%d", p, r.Width, r.Height, ph, pw)
			}
			h, err := lib.Header(mustRead(t, r.OutPath))
			if err != nil || h.Width != ph || h.Height != pw {
				t.Errorf("%s: mask file %+v, %v", p, h, err)
			}
		}
	})
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
