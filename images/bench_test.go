package images

import (
	"bytes"
	"sync"
	"testing"

	"golang.org/x/image/draw"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

var photo12MP struct {
	once sync.Once
	data []byte
	err  error
}

// jpeg12MP is a 4032×3024 q90 JPEG (a phone photo's size), written once by libvips.
func jpeg12MP(b *testing.B) []byte {
	l := testenv.RequireVips(b)
	photo12MP.once.Do(func() {
		const w, h = 4032, 3024
		pix := picture(w, h)
		// Texture, so the JPEG has a photo's entropy rather than a flat gradient's.
		for i := range pix {
			pix[i] += byte((i * 2654435761) >> 27 & 15)
		}
		photo12MP.data, photo12MP.err = l.Encode(pix, w, h, 3, ".jpg[Q=90]", "", 0)
	})
	if photo12MP.err != nil {
		b.Fatal(photo12MP.err)
	}
	return photo12MP.data
}

// BenchmarkPreprocess12MP turns a 12 MP JPEG into the PixAI tagger's 448×448 NCHW input:
// libvips (the production path: shrink on load, Lanczos3, one thread) against Go's
// decoder and resize (the reference path).
//
//	go test ./images -run '^$' -bench Preprocess12MP -benchtime 20x
func BenchmarkPreprocess12MP(b *testing.B) {
	data := jpeg12MP(b)
	const size = 448
	px := make([]float32, 3*size*size)
	b.Run("libvips", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			img, _, err := LoadBytes(data, 0, LoadSpec{Width: size, Height: size, Fill: FillForce, Background: WhiteRGBA})
			if err != nil {
				b.Fatal(err)
			}
			ToCHW(Resize(FlattenOn(img, White), size, size, draw.BiLinear), px, HalfMean, HalfStd, Scale255, false)
		}
	})
	b.Run("go", func(b *testing.B) {
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
