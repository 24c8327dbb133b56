package images

import (
	"bytes"
	"errors"
	"image"
	"image/color"
	"os"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// TestOpenMaxBytes: a file over MaxBytes is image_too_large from its size, before it is
// read, with details bytes and max_bytes; one at the limit is read.
func TestOpenMaxBytes(t *testing.T) {
	f := newFixture(t)
	path := f.p("img/a.png")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()
	if _, _, err := (Policy{AllowedRoots: []string{f.root}, MaxBytes: size}).Open(path); err != nil {
		t.Fatalf("MaxBytes = size: %v", err)
	}
	_, _, err = Policy{AllowedRoots: []string{f.root}, MaxBytes: size - 1}.Open(path)
	var ce *codec.Error
	if !errors.As(err, &ce) || ce.Code != codec.CodeImageTooLarge {
		t.Fatalf("MaxBytes = size-1: %v, want image_too_large", err)
	}
	for k, want := range map[string]any{"bytes": size, "max_bytes": size - 1, "path": path} {
		if ce.Details[k] != want {
			t.Errorf("details[%s] = %v (%T), want %v", k, ce.Details[k], ce.Details[k], want)
		}
	}
}

// endless yields bytes forever and counts them.
type endless struct{ n int64 }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	e.n += int64(len(p))
	return len(p), nil
}

// TestReadBoundedGrowing: a file longer than its fstat said (it grew in between) is still
// refused once it passes the limit, and no more than limit+1 bytes are read.
func TestReadBoundedGrowing(t *testing.T) {
	const limit = 10000
	r := &endless{}
	_, err := readBounded(r, 100, limit, "img", kindImage)
	if codeOf(t, err) != codec.CodeImageTooLarge {
		t.Fatalf("endless file: %v, want image_too_large", err)
	}
	if r.n > limit+1 {
		t.Errorf("read %d bytes of an endless file, want at most %d", r.n, limit+1)
	}

	// A real file: stat it, let it grow past the limit, then read it.
	f := newFixture(t)
	path := f.p("img/grows.png")
	small := encodePNG(t, solid(2, 2, color.Black))
	writeFile(t, path, small)
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(small, make([]byte, limit)...), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = readBounded(file, fi.Size(), limit, path, kindImage)
	var ce *codec.Error
	if !errors.As(err, &ce) || ce.Code != codec.CodeImageTooLarge {
		t.Fatalf("grown file: %v, want image_too_large", err)
	}
	if ce.Details["max_bytes"] != int64(limit) {
		t.Errorf("details %v", ce.Details)
	}

	// Within the limit, every byte comes back, whatever the size hint.
	data := bytes.Repeat([]byte("0123456789"), 500)
	for _, hint := range []int64{0, 1, int64(len(data)), int64(len(data)) + 7} {
		got, err := readBounded(bytes.NewReader(data), hint, limit, "img", kindImage)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("hint %d: %d bytes, %v", hint, len(got), err)
		}
	}
}

// onceReader is a reader of data that fails the test if it is seeked (a second pass
// over the source), and counts what it gives.
type onceReader struct {
	t *testing.T
	r *bytes.Reader
	n int
}

func (o *onceReader) Read(p []byte) (int, error) {
	n, err := o.r.Read(p)
	o.n += n
	return n, err
}

func (o *onceReader) Seek(int64, int) (int64, error) {
	o.t.Error("the image source was seeked: it must be read once")
	return 0, errors.New("no seeking")
}

// TestDecodeReadsOnce: the header and the pixels come from one read of the source.
func TestDecodeReadsOnce(t *testing.T) {
	data := encodePNG(t, solid(8, 6, color.NRGBA{1, 2, 3, 255}))
	o := &onceReader{t: t, r: bytes.NewReader(data)}
	img, info, err := Decode(o, 0)
	if err != nil {
		t.Fatal(err)
	}
	if info.Width != 8 || info.Height != 6 || img.Bounds() != image.Rect(0, 0, 8, 6) {
		t.Errorf("info %+v bounds %v", info, img.Bounds())
	}
	if o.n != len(data) {
		t.Errorf("read %d bytes of a %d-byte file, want each byte once", o.n, len(data))
	}
}

// TestCheckDecoded: a decoded image must match its header (a GIF frame may lie inside
// it) and the pixel limit.
func TestCheckDecoded(t *testing.T) {
	for _, tt := range []struct {
		b      image.Rectangle
		format string
		w, h   int
		max    int64
		code   codec.Code
	}{
		{image.Rect(0, 0, 8, 6), "png", 8, 6, 48, ""},
		{image.Rect(0, 0, 9, 6), "png", 8, 6, 1000, codec.CodeUnsupportedImage},
		{image.Rect(0, 0, 4, 3), "png", 8, 6, 1000, codec.CodeUnsupportedImage},
		{image.Rect(1, 1, 9, 7), "jpeg", 8, 6, 1000, codec.CodeUnsupportedImage},
		{image.Rect(2, 1, 5, 4), "gif", 8, 6, 1000, ""},
		{image.Rect(2, 1, 9, 4), "gif", 8, 6, 1000, codec.CodeUnsupportedImage},
		{image.Rect(0, 0, 100, 100), "png", 8, 6, 1000, codec.CodeImageTooLarge},
	} {
		err := checkDecoded(tt.b, tt.format, tt.w, tt.h, tt.max, "img")
		if c := codeOf(t, err); c != tt.code {
			t.Errorf("checkDecoded(%v, %s, %dx%d, %d) = %v, want %q", tt.b, tt.format, tt.w, tt.h, tt.max, err, tt.code)
		}
	}
}

// TestDefaultLimits: the defaults take a 100 MP camera photo (Fujifilm GFX100,
// 11648×8736) and a large JPEG of it.
func TestDefaultLimits(t *testing.T) {
	if px := int64(11648 * 8736); DefaultMaxPixels < px {
		t.Errorf("DefaultMaxPixels %d refuses a %d-pixel photo", DefaultMaxPixels, px)
	}
	if DefaultMaxBytes < 64<<20 {
		t.Errorf("DefaultMaxBytes %d is under 64 MiB", DefaultMaxBytes)
	}
	if (Policy{}).maxBytes() != DefaultMaxBytes || (Policy{}).maxPixels() != DefaultMaxPixels {
		t.Error("the zero Policy does not use the defaults")
	}
}
