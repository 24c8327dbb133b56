package images

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestMaskToRGBA(t *testing.T) {
	src := solid(8, 4, color.NRGBA{10, 20, 30, 255})

	// A uniform mask keeps the colour and sets the alpha; out-of-range values clamp.
	for _, tt := range []struct {
		m    float32
		want uint8
	}{{1, 255}, {0, 0}, {0.5, 128}, {2, 255}, {-1, 0}, {float32(math.NaN()), 0}} {
		out := MaskToRGBA(src, []float32{tt.m, tt.m, tt.m, tt.m}, 2, 2)
		if out.Rect != image.Rect(0, 0, 8, 4) {
			t.Fatalf("bounds %v", out.Rect)
		}
		for i := 0; i < len(out.Pix); i += 4 {
			got := [4]uint8(out.Pix[i : i+4])
			if d := int(got[3]) - int(tt.want); d < -1 || d > 1 || (got[3] != 0 && got != [4]uint8{10, 20, 30, got[3]}) {
				t.Fatalf("mask %v: pixel %d = %v, want alpha %d", tt.m, i/4, got, tt.want)
			}
		}
	}

	// A 2x1 mask [0, 1] stretched over 8 columns: alpha rises left to right, from 0-ish
	// to 255-ish, the same on every row.
	out := MaskToRGBA(src, []float32{0, 1}, 2, 1)
	prev := -1
	for x := range 8 {
		a := int(out.NRGBAAt(x, 0).A)
		if a < prev {
			t.Errorf("alpha falls at x=%d: %d after %d", x, a, prev)
		}
		prev = a
		for y := 1; y < 4; y++ {
			if int(out.NRGBAAt(x, y).A) != a {
				t.Errorf("row %d differs at x=%d", y, x)
			}
		}
	}
	if l, r := out.NRGBAAt(0, 0).A, out.NRGBAAt(7, 0).A; l > 10 || r < 245 {
		t.Errorf("edges alpha %d .. %d, want about 0 .. 255", l, r)
	}

	// The source's own transparency is kept: alpha = mask × source alpha.
	half := solid(2, 2, color.NRGBA{200, 100, 50, 128})
	got := MaskToRGBA(half, []float32{1}, 1, 1).NRGBAAt(1, 1)
	if got.A < 127 || got.A > 129 || got.R < 198 || got.R > 202 {
		t.Errorf("half-transparent source: %v", got)
	}
}

func TestMaskToRGBAPanicsOnShortMask(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	MaskToRGBA(solid(2, 2, color.Black), []float32{1, 1, 1}, 2, 2)
}

func TestWritePNG(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.png")
	img := MaskToRGBA(solid(5, 3, color.NRGBA{1, 2, 3, 255}), []float32{0.25}, 1, 1)

	for range 2 { // the second write replaces the first
		if err := WritePNG(path, img); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	back, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if back.Bounds() != img.Bounds() {
		t.Fatalf("bounds %v", back.Bounds())
	}
	if got, want := color.NRGBAModel.Convert(back.At(2, 1)), img.NRGBAAt(2, 1); got != want {
		t.Errorf("pixel %v, want %v", got, want)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}

	// A symlink at the path is replaced, never written through.
	victim := filepath.Join(dir, "victim.txt")
	writeFile(t, victim, []byte("keep me"))
	link := filepath.Join(dir, "link.png")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if err := WritePNG(link, img); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep me" {
		t.Errorf("wrote through the symlink: %q", b)
	}
	if fi, _ := os.Lstat(link); !fi.Mode().IsRegular() {
		t.Errorf("link.png is %v, want a regular file", fi.Mode())
	}

	// A missing directory fails, leaving nothing.
	if err := WritePNG(filepath.Join(dir, "nodir", "x.png"), img); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}
