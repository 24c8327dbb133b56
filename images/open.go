package images

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/draw"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	// The decodable formats, registered with the image package by import.
	_ "image/gif"
	_ "image/jpeg"
	_ "image/png"

	_ "golang.org/x/image/bmp"
	_ "golang.org/x/image/webp"

	"github.com/ortbus/ortbus/codec"
)

// Info describes an opened image, as its header declares it.
type Info struct {
	// Path is the resolved path that was read (symlinks followed). Empty from Decode.
	Path string `json:"path,omitempty" msgpack:"path,omitempty"`
	// Format is the decoder's name: "png", "jpeg", "gif", "bmp" or "webp".
	Format string `json:"format" msgpack:"format"`
	Width  int    `json:"width" msgpack:"width"`
	Height int    `json:"height" msgpack:"height"`
}

// formats are the decoder names accepted; anything else registered is refused.
var formats = map[string]bool{"png": true, "jpeg": true, "gif": true, "bmp": true, "webp": true}

// Open checks path against the policy, then reads and decodes the image with Go's
// decoders. It is the reference path of the tests and benchmarks: the model kinds load
// their inputs with Load (libvips). Errors are *codec.Error:
//
//   - bad_request: path empty, relative or not clean (e.g. /srv/img/../etc/passwd);
//   - forbidden_path: outside the allowed roots as spelled, or once symlinks are resolved,
//     or not readable by this process;
//   - file_not_found: inside a root but missing;
//   - unsupported_image: a directory or other non-regular file, an unknown format, or a
//     truncated or corrupt file (the message carries the decoder's error);
//   - image_too_large: a file over MaxBytes, found from its size before reading it and
//     enforced while reading it (details: bytes, max_bytes); or width*height over
//     MaxPixels, found from the header alone, before any pixel memory is allocated
//     (details: width, height, max_pixels).
//
// The file is read once, into memory, and both the header and the pixels are decoded
// from that one copy, so a file rewritten while it is read cannot pass the header check
// with one content and be decoded with another.
//
// A GIF gives its first frame, placed on a canvas of the GIF's logical screen size.
func (p Policy) Open(path string) (image.Image, Info, error) {
	data, resolved, err := p.read(path)
	if err != nil {
		return nil, Info{}, err
	}
	img, info, err := decode(data, p.maxPixels(), path)
	if err != nil {
		return nil, Info{}, withPath(err, path)
	}
	info.Path = resolved
	return img, info, nil
}

// read does Open's path checks and reads the file once, bounded by MaxBytes. It returns
// the bytes and the resolved path.
func (p Policy) read(path string) ([]byte, string, error) {
	return p.readInto(path, nil)
}

// readInto is read into buf's memory when its capacity holds the file (buf's contents
// are overwritten), else into a new buffer.
func (p Policy) readInto(path string, buf []byte) ([]byte, string, error) {
	roots, err := p.admit(path)
	if err != nil {
		return nil, "", err
	}
	resolved, err := resolveInside(path, roots)
	if err != nil {
		return nil, "", err
	}
	f, err := openRegular(resolved, rootOf(roots, resolved), path, kindImage)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, "", resolveError(err, path)
	}
	data, err := readBoundedInto(buf, f, fi.Size(), p.maxBytes(), path, kindImage)
	if err != nil {
		return nil, "", withPath(err, path)
	}
	return data, resolved, nil
}

// Decode decodes an image from r with the same format set, size limits (maxPixels <= 0
// means DefaultMaxPixels; at most DefaultMaxBytes are read) and error codes as Open. r is
// read once, to its end, and never seeked.
func Decode(r io.Reader, maxPixels int64) (image.Image, Info, error) {
	if maxPixels <= 0 {
		maxPixels = DefaultMaxPixels
	}
	data, err := readBounded(r, 0, DefaultMaxBytes, "image", kindImage)
	if err != nil {
		return nil, Info{}, err
	}
	return decode(data, maxPixels, "image")
}

// readBounded reads r to its end into one buffer, refusing more than limit bytes with
// image_too_large: at once when size (the file's size from fstat, 0 when unknown) is
// over limit, and while reading, through a LimitReader of limit+1 bytes, when the file is
// longer than it said (it grew after the fstat, or size was unknown). The buffer is sized
// from size, so a file that keeps its size is read without copying. A read error is
// kind's (unsupported_image for an image, bad_request for a tensor).
func readBounded(r io.Reader, size, limit int64, name string, kind fileKind) ([]byte, error) {
	return readBoundedInto(nil, r, size, limit, name, kind)
}

// readBoundedInto is readBounded into buf's memory when its capacity holds size+1 bytes.
func readBoundedInto(buf []byte, r io.Reader, size, limit int64, name string, kind fileKind) ([]byte, error) {
	if size > limit {
		return nil, codec.Errorf(codec.CodeImageTooLarge, "%s is %d bytes, over the limit of %d bytes", name, size, limit).
			With("bytes", size).With("max_bytes", limit)
	}
	if want := min(max(size+1, 512), limit+1); int64(cap(buf)) >= want {
		buf = buf[:0]
	} else {
		buf = make([]byte, 0, want)
	}
	lr := io.LimitReader(r, limit+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // grow
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return nil, codec.Errorf(codec.CodeImageTooLarge, "%s is more than %d bytes, over the limit", name, limit).
				With("bytes", int64(len(buf))).With("max_bytes", limit)
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, codec.Errorf(kind.code, "cannot read %s: %v", name, err)
		}
	}
}

// openRegular opens resolved for reading, refusing anything but a regular file. The
// file is opened through an os.Root at its allowed root, so a symlink swapped into the
// path after it was checked still cannot lead outside; and with O_NONBLOCK, so that a
// FIFO swapped in cannot block the open. name is the client's spelling, for messages;
// kind what the file should be.
func openRegular(resolved, root, name string, kind fileKind) (*os.File, error) {
	fi, err := os.Stat(resolved)
	if err != nil {
		return nil, resolveError(err, name)
	}
	if err := regular(fi, name, kind); err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(root, resolved)
	if err != nil || root == "" {
		return nil, forbidden(name)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, resolveError(err, name)
	}
	defer r.Close()
	f, err := r.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if strings.Contains(err.Error(), "escapes") {
			return nil, forbidden(name)
		}
		return nil, resolveError(err, name)
	}
	fi, err = f.Stat()
	if err == nil {
		err = regular(fi, name, kind)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// fileKind is what a file read by path should be: the code and the noun of its refusals.
type fileKind struct {
	code codec.Code
	noun string
}

var (
	kindImage  = fileKind{codec.CodeUnsupportedImage, "an image file"}
	kindTensor = fileKind{codec.CodeBadRequest, "a .npy tensor file"}
)

// regular refuses directories and other non-regular files with kind's code
// (unsupported_image for an image).
func regular(fi fs.FileInfo, name string, kind fileKind) error {
	switch {
	case fi.IsDir():
		return codec.Errorf(kind.code, "%s is a directory, not %s", name, kind.noun).With("path", name)
	case !fi.Mode().IsRegular():
		return codec.Errorf(kind.code, "%s is not a regular file (%s)", name, fi.Mode().Type()).With("path", name)
	}
	return nil
}

// decode reads the header from data, enforces the format set and the pixel limit, then
// decodes the same bytes and checks that the image is the size its header declared.
func decode(data []byte, maxPixels int64, name string) (img image.Image, info Info, err error) {
	defer func() {
		// The decoders see hostile bytes; a panic in one must fail this image, not the worker.
		if v := recover(); v != nil {
			img, info = nil, Info{}
			err = codec.Errorf(codec.CodeUnsupportedImage, "cannot decode %s: decoder failed: %v", name, v)
		}
	}()
	cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		if errors.Is(err, image.ErrFormat) {
			return nil, Info{}, codec.Errorf(codec.CodeUnsupportedImage,
				"%s is not a PNG, JPEG, GIF, BMP or WebP image (%v)", name, err)
		}
		return nil, Info{}, codec.Errorf(codec.CodeUnsupportedImage, "cannot read the header of %s: %v", name, err)
	}
	if !formats[format] {
		return nil, Info{}, codec.Errorf(codec.CodeUnsupportedImage,
			"%s is a %s image; only PNG, JPEG, GIF, BMP and WebP are accepted", name, format)
	}
	info = Info{Format: format, Width: cfg.Width, Height: cfg.Height}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return nil, Info{}, codec.Errorf(codec.CodeUnsupportedImage,
			"%s declares an empty size %dx%d", name, cfg.Width, cfg.Height)
	}
	if px := int64(cfg.Width) * int64(cfg.Height); px > maxPixels {
		return nil, Info{}, codec.Errorf(codec.CodeImageTooLarge,
			"%s is %dx%d = %d pixels, over the limit of %d", name, cfg.Width, cfg.Height, px, maxPixels).
			With("width", cfg.Width).With("height", cfg.Height).With("max_pixels", maxPixels)
	}
	img, format2, err := image.Decode(bytes.NewReader(data))
	if err != nil {
		return nil, Info{}, codec.Errorf(codec.CodeUnsupportedImage, "cannot decode %s image %s: %v", format, name, err)
	}
	if format2 != format {
		return nil, Info{}, codec.Errorf(codec.CodeUnsupportedImage, "%s changed format while being read", name)
	}
	if err := checkDecoded(img.Bounds(), format, cfg.Width, cfg.Height, maxPixels, name); err != nil {
		return nil, Info{}, err
	}
	return onCanvas(img, cfg.Width, cfg.Height), info, nil
}

// checkDecoded checks a decoded image's bounds against the header's size: equal to it, or
// for a GIF (whose first frame may cover part of the logical screen) inside it; and its
// pixels against the limit, so a decoder that disagrees with its own header cannot hand
// on more than the header check let through.
func checkDecoded(b image.Rectangle, format string, w, h int, maxPixels int64, name string) error {
	header := image.Rect(0, 0, w, h)
	if px := int64(b.Dx()) * int64(b.Dy()); px > maxPixels {
		return codec.Errorf(codec.CodeImageTooLarge,
			"%s decoded to %dx%d = %d pixels, over the limit of %d", name, b.Dx(), b.Dy(), px, maxPixels).
			With("width", b.Dx()).With("height", b.Dy()).With("max_pixels", maxPixels)
	}
	if b == header || (format == "gif" && !b.Empty() && b.In(header)) {
		return nil
	}
	return codec.Errorf(codec.CodeUnsupportedImage,
		"%s decoded to bounds %v, not the %dx%d its header declares", name, b, w, h)
}

// onCanvas returns img unchanged when its bounds are (0,0)-(w,h), as for every format but
// GIF; a GIF's first frame may cover only part of the logical screen, so it is drawn onto
// a transparent canvas of the declared size.
func onCanvas(img image.Image, w, h int) image.Image {
	want := image.Rect(0, 0, w, h)
	if img.Bounds() == want {
		return img
	}
	canvas := image.NewRGBA(want)
	b := img.Bounds().Intersect(want)
	draw.Draw(canvas, b, img, b.Min, draw.Src)
	return canvas
}

// String gives "png 640x480" for logs.
func (i Info) String() string { return fmt.Sprintf("%s %dx%d", i.Format, i.Width, i.Height) }
