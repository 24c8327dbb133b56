package images

import (
	"bytes"
	"sync"
	"testing"

	"golang.org/x/image/draw"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// benchFile is one input of the preprocessing benchmarks, written once by libvips.
type benchFile struct {
	once sync.Once
	data []byte
	err  error
}

var benchFiles = map[string]*benchFile{"jpeg-12MP": {}, "png-2K": {}, "webp-2K": {}}

// benchInput returns the named input: "jpeg-12MP", a 4032×3024 q90 JPEG (a phone photo's
// size); "png-2K" and "webp-2K", a 2048×2048 illustration (q90 WebP).
func benchInput(b *testing.B, name string) []byte {
	l := testenv.RequireVips(b)
	f := benchFiles[name]
	f.once.Do(func() {
		w, h, suffix := 2048, 2048, ".png"
		switch name {
		case "jpeg-12MP":
			w, h, suffix = 4032, 3024, ".jpg[Q=90]"
		case "webp-2K":
			suffix = ".webp[Q=90]"
		}
		pix := picture(w, h)
		if name == "jpeg-12MP" {
			// Texture, so the JPEG has a photo's entropy rather than a flat gradient's.
			for i := range pix {
				pix[i] += byte((i * 2654435761) >> 27 & 15)
			}
		}
		f.data, f.err = l.Encode(pix, w, h, 3, suffix, "", 0)
	})
	if f.err != nil {
		b.Fatal(f.err)
	}
	return f.data
}

// BenchmarkPreprocess turns each input into the PixAI tagger's 448×448 NCHW input:
// libvips (the production path: shrink on load, Lanczos3, one thread) against Go's
// decoders and resize (the reference path).
//
//	go test ./images -run '^$' -bench Preprocess -benchtime 20x
func BenchmarkPreprocess(b *testing.B) {
	const size = 448
	px := make([]float32, 3*size*size)
	for _, name := range []string{"jpeg-12MP", "png-2K", "webp-2K"} {
		data := benchInput(b, name)
		b.Run(name+"/libvips", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				img, _, err := LoadBytes(data, 0, LoadSpec{Width: size, Height: size, Fill: FillForce, Background: WhiteRGBA})
				if err != nil {
					b.Fatal(err)
				}
				ToCHW(Resize(FlattenOn(img, White), size, size, draw.BiLinear), px, HalfMean, HalfStd, Scale255, false)
			}
		})
		b.Run(name+"/go", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				img, _, err := Decode(bytes.NewReader(data), 0)
				if err != nil {
					b.Fatal(err)
				}
				ToCHW(Resize(FlattenOn(img, White), size, size, draw.BiLinear), px, HalfMean, HalfStd, Scale255, false)
			}
		})
	}
}
