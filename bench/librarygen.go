package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/ortbus/ortbus/images/vips"
)

// The library bench's generated library: what an image-library user's folder holds,
// written by libvips from deterministic pixels (a fixed seed), so that every run and
// every machine measures the same files.

// LibraryFiles is the library bench's default size (-files).
const LibraryFiles = 40

// libraryKind is one shape of file of the library.
type libraryKind struct {
	Name string // the row of the per-format table
	W, H int
	// Photo: smooth gradients, soft blobs and sensor-like noise (JPEG sizes of a phone's);
	// otherwise an illustration: flat colours with hard edges over a gradient.
	Photo       bool
	Suffix      string // libvips's save suffix and options
	To          string // colourspace to convert to before saving (vips.Encode's to)
	Orientation int
	Alpha       bool
	Ext         string
}

// libraryKinds are the kinds, in the order the library cycles through them: file i is
// kind i mod len; the 12 MP photos come up three times in each cycle.
var libraryKinds = []libraryKind{
	{Name: "jpeg-12mp", W: 4032, H: 3024, Photo: true, Suffix: ".jpg[Q=90]", Ext: "jpg"},
	{Name: "jpeg-12mp-exif6", W: 4032, H: 3024, Photo: true, Suffix: ".jpg[Q=90]", Orientation: 6, Ext: "jpg"},
	{Name: "png-2k", W: 2048, H: 1536, Suffix: ".png", Alpha: true, Ext: "png"},
	{Name: "webp-2k", W: 2048, H: 1536, Suffix: ".webp[Q=85]", Ext: "webp"},
	{Name: "avif-2k", W: 2048, H: 1536, Suffix: ".avif[Q=60,effort=0]", Ext: "avif"},
	{Name: "jpeg-cmyk", W: 2400, H: 1600, Photo: true, Suffix: ".jpg[Q=90]", To: "cmyk", Ext: "jpg"},
	{Name: "png-16bit", W: 1600, H: 1200, Photo: true, Suffix: ".png", To: "rgb16", Ext: "png"},
	{Name: "jpeg-gray", W: 2400, H: 1800, Photo: true, Suffix: ".jpg[Q=90]", To: "b-w", Ext: "jpg"},
	{Name: "jpeg-progressive", W: 3264, H: 2448, Photo: true, Suffix: ".jpg[Q=90,interlace]", Ext: "jpg"},
	{Name: "tiff", W: 1600, H: 1200, Photo: true, Suffix: ".tif[compression=lzw]", Ext: "tif"},
	{Name: "gif", W: 800, H: 600, Suffix: ".gif", Ext: "gif"},
	{Name: "jpeg-12mp", W: 4032, H: 3024, Photo: true, Suffix: ".jpg[Q=90]", Ext: "jpg"},
}

// LibraryFile is one file of the generated library.
type LibraryFile struct {
	Name        string `json:"name"`
	Kind        string `json:"kind"`
	Width       int    `json:"width"`
	Height      int    `json:"height"`
	Orientation int    `json:"orientation,omitempty"`
	Bytes       int    `json:"bytes"`
	path        string
}

// libraryPlan is the library of n files: file i is kind i mod len(libraryKinds), with the
// seed i (its pixels differ from every other file's).
func libraryPlan(n int) []LibraryFile {
	files := make([]LibraryFile, n)
	for i := range files {
		k := libraryKinds[i%len(libraryKinds)]
		files[i] = LibraryFile{Name: fmt.Sprintf("%03d-%s.%s", i, k.Name, k.Ext), Kind: k.Name, Width: k.W, Height: k.H, Orientation: k.Orientation}
	}
	return files
}

func kindNamed(name string) libraryKind {
	for _, k := range libraryKinds {
		if k.Name == name {
			return k
		}
	}
	panic("bench: no library kind " + name)
}

// writeLibraryFiles writes the plan's files into dir with libvips.
func writeLibraryFiles(lib *vips.Lib, dir string, files []LibraryFile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := range files {
		f := &files[i]
		k := kindNamed(f.Kind)
		k.W, k.H = f.Width, f.Height // the plan's size (Options.Shrink may have made it smaller)
		bands := 3
		if k.Alpha {
			bands = 4
		}
		pix := libraryPixels(k, bands, uint64(i)+1)
		b, err := lib.Encode(pix, k.W, k.H, bands, k.Suffix, k.To, k.Orientation)
		if err != nil {
			return fmt.Errorf("library file %s: %w", f.Name, err)
		}
		f.path = filepath.Join(dir, f.Name)
		f.Bytes = len(b)
		if err := os.WriteFile(f.path, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// libraryPixels are a file's deterministic pixels (w*h*bands bytes).
func libraryPixels(k libraryKind, bands int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 0x6c6962))
	w, h := k.W, k.H
	pix := make([]byte, w*h*bands)
	// A gradient background between two colours, a few shapes.
	var c0, c1 [3]float64
	for c := range 3 {
		c0[c], c1[c] = 40+rng.Float64()*170, 40+rng.Float64()*170
	}
	type blob struct {
		x, y, r float64
		col     [3]float64
	}
	blobs := make([]blob, 6)
	for i := range blobs {
		blobs[i] = blob{x: rng.Float64() * float64(w), y: rng.Float64() * float64(h), r: (0.08 + rng.Float64()*0.25) * float64(min(w, h))}
		for c := range 3 {
			blobs[i].col[c] = rng.Float64() * 255
		}
	}
	noise := 0.0
	if k.Photo {
		noise = 10
	}
	for y := range h {
		fy := float64(y) / float64(h)
		for x := range w {
			fx := float64(x) / float64(w)
			t := 0.5*fx + 0.5*fy + 0.05*math.Sin(fx*17+fy*11)
			var v [3]float64
			for c := range 3 {
				v[c] = c0[c] + (c1[c]-c0[c])*t
			}
			for _, b := range blobs {
				dx, dy := float64(x)-b.x, float64(y)-b.y
				d := math.Sqrt(dx*dx+dy*dy) / b.r
				var a float64
				if k.Photo {
					a = math.Exp(-d * d * 2) // soft
				} else if d < 1 {
					a = 1 // flat, hard-edged
					if d > 0.92 {
						v = [3]float64{20, 20, 30} // an outline
						continue
					}
				}
				for c := range 3 {
					v[c] += (b.col[c] - v[c]) * a
				}
			}
			i := (y*w + x) * bands
			n := 0.0
			if noise > 0 {
				n = rng.NormFloat64() * noise
			}
			for c := range 3 {
				pix[i+c] = byte(min(255, max(0, v[c]+n)))
			}
			if bands == 4 {
				pix[i+3] = 255
				if fx < 0.1 || fy < 0.1 {
					pix[i+3] = 0 // a transparent border
				}
			}
		}
	}
	return pix
}
