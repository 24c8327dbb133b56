package images

import (
	"bytes"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"testing"
)

// TestSniff names each format by its content, whatever a file is called, and refuses
// text, truncated headers and near misses.
func TestSniff(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 4, 4))
	img.Set(1, 1, color.RGBA{R: 255, A: 255})
	var pngB, jpgB, gifB bytes.Buffer
	if err := png.Encode(&pngB, img); err != nil {
		t.Fatal(err)
	}
	if err := jpeg.Encode(&jpgB, img, nil); err != nil {
		t.Fatal(err)
	}
	if err := gif.Encode(&gifB, img, nil); err != nil {
		t.Fatal(err)
	}
	bmp := append([]byte("BM\x46\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00"), 40, 0, 0, 0, 4, 0, 0, 0)
	avif := []byte("\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf")
	avifCompat := []byte("\x00\x00\x00\x1cftypmif1\x00\x00\x00\x00mif1avifmiaf")
	heic := []byte("\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic")
	mp4 := []byte("\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2")
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"png", pngB.Bytes(), "png"},
		{"jpeg", jpgB.Bytes(), "jpeg"},
		{"gif", gifB.Bytes(), "gif"},
		{"webp", []byte("RIFF\x1a\x00\x00\x00WEBPVP8L"), "webp"},
		{"tiff le", []byte("II*\x00\x08\x00\x00\x00"), "tiff"},
		{"tiff be", []byte("MM\x00*\x00\x00\x00\x08"), "tiff"},
		{"bmp", bmp, "bmp"},
		{"avif", avif, "avif"},
		{"avif compatible brand", avifCompat, "avif"},
		{"heic", heic, "heif"},
		{"jxl codestream", []byte{0xFF, 0x0A, 0xFA, 0x7F}, "jxl"},
		{"jxl container", []byte("\x00\x00\x00\x0cJXL \r\n\x87\n\x00\x00"), "jxl"},
		{"ppm", []byte("P6\n4 4\n255\n"), "pnm"},
		{"mp4 is no image", mp4, ""},
		{"text", []byte("hello, world: not an image at all"), ""},
		{"empty", nil, ""},
		{"riff wav", []byte("RIFF\x1a\x00\x00\x00WAVEfmt "), ""},
		{"BM text", []byte("BMW is a car, and this is a text file"), ""},
		{"truncated jpeg", []byte{0xFF, 0xD8}, ""},
		{"ftyp box too short", []byte("\x00\x00\x00\x08ftyp"), ""},
		{"P7 is no pnm", []byte("P7\nWIDTH 4\n"), ""},
	} {
		b := c.b
		if len(b) > SniffLen {
			b = b[:SniffLen]
		}
		if got := Sniff(b); got != c.want {
			t.Errorf("%s: Sniff = %q, want %q", c.name, got, c.want)
		}
	}
}

// FuzzSniff: Sniff never panics and only names formats it knows.
func FuzzSniff(f *testing.F) {
	f.Add([]byte("\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf"))
	f.Add([]byte("\xff\xff\xff\xffftyp"))
	f.Add([]byte("BM"))
	f.Fuzz(func(t *testing.T, b []byte) {
		switch Sniff(b) {
		case "", "jpeg", "png", "gif", "webp", "tiff", "bmp", "jxl", "pnm", "avif", "heif":
		default:
			t.Fatalf("Sniff(%q) named an unknown format", b)
		}
	})
}
