package images

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// fixture is a directory tree with an allowed root and the traps around it:
//
//	base/img/                  the allowed root
//	    a.png                  a valid 8x6 PNG
//	    sub/                   a directory
//	    fifo                   a named pipe
//	    text.png               a text file with a .png name
//	    trunc.png              a valid PNG cut in half
//	    huge.png               an IHDR declaring 100000x100000, no pixel data
//	    link_in.png   -> a.png
//	    link_out.png  -> ../outside/secret.png
//	    dangling_in.png  -> missing.png
//	    dangling_out.png -> ../outside/missing.png
//	    linkdir_out   -> ../outside
//	    loop.png      -> loop.png (a symlink loop)
//	base/img2/a.png            a prefix sibling of the root
//	base/outside/secret.png    outside every root
//	base/rootlink -> img       a root configured through a symlink
type fixture struct {
	base string
	root string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{base: base, root: filepath.Join(base, "img")}
	for _, d := range []string{"img/sub", "img2", "outside"} {
		mustMkdir(t, f.p(d))
	}
	valid := encodePNG(t, solid(8, 6, color.NRGBA{200, 100, 50, 255}))
	writeFile(t, f.p("img/a.png"), valid)
	writeFile(t, f.p("img2/a.png"), valid)
	writeFile(t, f.p("outside/secret.png"), valid)
	writeFile(t, f.p("img/text.png"), []byte("this is not an image, just text\n"))
	writeFile(t, f.p("img/trunc.png"), valid[:len(valid)/2])
	writeFile(t, f.p("img/huge.png"), pngHeaderOnly(100000, 100000))
	if err := syscall.Mkfifo(f.p("img/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"img/link_in.png":      "a.png",
		"img/link_out.png":     "../outside/secret.png",
		"img/dangling_in.png":  "missing.png",
		"img/dangling_out.png": "../outside/missing.png",
		"img/linkdir_out":      "../outside",
		"img/loop.png":         "loop.png",
		"rootlink":             "img",
	}
	for name, target := range links {
		if err := os.Symlink(target, f.p(name)); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// p returns the absolute path of a fixture-relative name.
func (f fixture) p(rel string) string { return filepath.Join(f.base, filepath.FromSlash(rel)) }

func (f fixture) policy() Policy { return Policy{AllowedRoots: []string{f.root}} }

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func solid(w, h int, c color.Color) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, c)
		}
	}
	return img
}

func encodePNG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// pngHeaderOnly is a PNG signature, an IHDR chunk declaring w×h 8-bit RGBA with a
// correct CRC, and IEND: enough for DecodeConfig, no pixel data to decode.
func pngHeaderOnly(w, h uint32) []byte {
	chunk := func(typ string, data []byte) []byte {
		out := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
		body := append([]byte(typ), data...)
		out = append(out, body...)
		return binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(body))
	}
	ihdr := binary.BigEndian.AppendUint32(nil, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	ihdr = append(ihdr, 8, 6, 0, 0, 0) // bit depth, colour type RGBA, compression, filter, interlace
	out := []byte("\x89PNG\r\n\x1a\n")
	out = append(out, chunk("IHDR", ihdr)...)
	return append(out, chunk("IEND", nil)...)
}

// codeOf returns the contract code of err, failing the test if err is not a *codec.Error.
func codeOf(t *testing.T, err error) codec.Code {
	t.Helper()
	if err == nil {
		return ""
	}
	var ce *codec.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a *codec.Error", err, err)
	}
	return ce.Code
}
