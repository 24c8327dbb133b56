// Package vips is ortbus's binding to libvips, the image pipeline of every model kind: a
// small cgo file (vips.c) that dlopen()s libvips-cpp.so.8.x at run time, as onnxruntime_go
// does for ONNX Runtime, so that building and vetting need neither libvips's headers nor
// the library. `make prepare` puts sharp's prebuilt libvips into .deps/libvips-VERSION/lib
// (scripts/fetch-libvips.sh).
//
// The library is started once per process with its operation cache off (no decoded image
// outlives its request), Concurrency threads per operation (1 unless ORTBUS_VIPS_THREADS
// says otherwise: the worker runs items side by side instead), and the loaders libvips
// marks untrusted blocked. Every byte given to it is hostile: errors come back as
// *codec.Error with the contract's stable codes (unsupported_image for what cannot be
// loaded), never as a panic.
package vips

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "vips.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/ortbus/ortbus/codec"
)

// Env names the environment variables read by Find and Load.
const (
	// EnvLibrary is an explicit libvips library file (libvips-cpp.so.8.x or libvips.so.42).
	EnvLibrary = "ORTBUS_LIBVIPS"
	// EnvThreads is libvips's threads per operation (default 1).
	EnvThreads = "ORTBUS_VIPS_THREADS"
)

// Lib is the libvips loaded into this process.
type Lib struct {
	Path    string
	Version string
	Threads int
}

var (
	mu      sync.Mutex
	current *Lib
	loadErr error
)

// Candidates lists, in order, the files Find tries: $ORTBUS_LIBVIPS alone when it is set
// (an explicit choice is never silently replaced by another library), else every
// .deps/libvips-*/lib/libvips-cpp.so.* in the executable's directory, its parent, and the
// working directory and each directory above it (the repository's .deps from a test).
func Candidates() []string {
	if p := os.Getenv(EnvLibrary); p != "" {
		return []string{p}
	}
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		d := filepath.Dir(exe)
		dirs = append(dirs, d, filepath.Dir(d))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			dirs = append(dirs, d)
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, d := range dirs {
		libs, _ := filepath.Glob(filepath.Join(d, ".deps", "libvips-*", "lib", "libvips-cpp.so.*"))
		sort.Sort(sort.Reverse(sort.StringSlice(libs))) // the newest version first
		for _, l := range libs {
			add(l)
		}
	}
	return out
}

// Find returns the first candidate that is a regular file, or a runtime_missing error
// naming every place searched and the command that installs libvips.
func Find() (string, error) {
	cands := Candidates()
	for _, p := range cands {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", codec.Errorf(codec.CodeRuntimeMissing,
		"libvips not found (run `make prepare`, or set %s to libvips-cpp.so.8.x); searched %s",
		EnvLibrary, strings.Join(cands, ", ")).With("searched", cands)
}

// Default finds and loads libvips once per process; later calls return the same answer.
func Default() (*Lib, error) {
	mu.Lock()
	defer mu.Unlock()
	if current != nil || loadErr != nil {
		return current, loadErr
	}
	p, err := Find()
	if err != nil {
		loadErr = err
		return nil, err
	}
	current, loadErr = load(p)
	return current, loadErr
}

// Load loads libvips from path, once per process: a second, different path is refused.
func Load(path string) (*Lib, error) {
	mu.Lock()
	defer mu.Unlock()
	if current != nil {
		if current.Path == path {
			return current, nil
		}
		return nil, codec.Errorf(codec.CodeInternal, "cannot load libvips %s: this process already runs %s", path, current.Path)
	}
	l, err := load(path)
	if err == nil {
		current, loadErr = l, nil
	}
	return l, err
}

func load(path string) (*Lib, error) {
	threads := 1
	if s := os.Getenv(EnvThreads); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1024 {
			return nil, codec.Errorf(codec.CodeBadRequest, "%s=%q is not a thread count", EnvThreads, s)
		}
		threads = n
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [512]C.char
	if C.ob_open(cpath, &errbuf[0], C.size_t(len(errbuf))) != 0 {
		return nil, codec.Errorf(codec.CodeRuntimeMissing, "loading libvips %s: %s", path, C.GoString(&errbuf[0])).
			With("searched", []string{path})
	}
	if C.ob_init(C.int(threads)) != 0 {
		return nil, codec.Errorf(codec.CodeRuntimeMissing, "starting libvips %s: %s", path, lastError())
	}
	return &Lib{Path: path, Version: C.GoString(C.ob_version()), Threads: threads}, nil
}

// lastError takes libvips's error buffer (shared by every thread: under concurrent
// failures a message may carry another's lines; the codes never do).
func lastError() string {
	var buf [1024]C.char
	C.ob_error(&buf[0], C.size_t(len(buf)))
	if s := strings.TrimSpace(C.GoString(&buf[0])); s != "" {
		return s
	}
	return "libvips gave no reason"
}

// Header is what an image's header declares, read without decoding its pixels.
type Header struct {
	// Loader is libvips's loader class, e.g. "VipsForeignLoadJpegBuffer".
	Loader string
	// Format is the short name: jpeg, png, webp, heif, tiff, gif, svg, ... (from Loader).
	Format string
	// Width and Height are as stored (before the EXIF orientation; a multi-page image's
	// first page).
	Width, Height, Bands, Pages int
	// Orientation is the EXIF orientation, 1-8 (1 when absent).
	Orientation int
}

// Upright returns the size as displayed: width and height swapped for EXIF orientations
// 5-8 (the transposing ones).
func (h Header) Upright() (w, ht int) {
	if h.Orientation >= 5 && h.Orientation <= 8 {
		return h.Height, h.Width
	}
	return h.Width, h.Height
}

// cbuf is the bytes given to libvips. libvips reads them in place, for as long as the
// image made from them lives; every image is made and released within one C call (with
// the operation cache off, no operation outlives it), so Go memory, which holds no Go
// pointers and does not move, is passed as it is (the cgo rules allow a pointer that C
// does not keep after the call returns). Copying 12 MP photos' bytes into C memory cost
// 5-7 ms each. keep holds data until free.
type cbuf struct {
	p    unsafe.Pointer
	n    C.size_t
	keep []byte
}

var empty = []byte{0}

func newCBuf(data []byte) cbuf {
	if len(data) == 0 {
		return cbuf{p: unsafe.Pointer(&empty[0]), n: 0, keep: empty}
	}
	return cbuf{p: unsafe.Pointer(&data[0]), n: C.size_t(len(data)), keep: data}
}

func (b cbuf) free() { runtime.KeepAlive(b.keep) }

// Header reads data's header only. An unrecognised or unreadable header is
// unsupported_image.
func (l *Lib) Header(data []byte) (Header, error) {
	b := newCBuf(data)
	defer b.free()
	return l.header(b)
}

func (l *Lib) header(b cbuf) (Header, error) {
	var h C.ob_header
	switch C.ob_header_buffer(b.p, b.n, &h) {
	case 0:
	case -1:
		lastError()
		return Header{}, codec.Errorf(codec.CodeUnsupportedImage, "not an image format libvips %s loads", l.Version)
	default:
		return Header{}, codec.Errorf(codec.CodeUnsupportedImage, "cannot read the image header: %s", lastError())
	}
	loader := C.GoString(&h.loader[0])
	return Header{Loader: loader, Format: FormatOf(loader), Width: int(h.width), Height: int(h.height),
		Bands: int(h.bands), Pages: int(h.pages), Orientation: max(1, int(h.orientation))}, nil
}

// FormatOf maps a loader class or nickname to a short format name:
// "VipsForeignLoadJpegBuffer" and "jpegload_buffer" give "jpeg".
func FormatOf(loader string) string {
	s := strings.ToLower(loader)
	s = strings.TrimPrefix(s, "vipsforeignload")
	for _, suf := range []string{"load_buffer", "load_source", "load", "buffer", "source", "file"} {
		s = strings.TrimSuffix(s, suf)
	}
	switch {
	case strings.HasPrefix(s, "jpeg"), strings.HasPrefix(s, "jpg"):
		return "jpeg"
	case strings.HasPrefix(s, "png"):
		return "png"
	case strings.HasPrefix(s, "tiff"):
		return "tiff"
	case strings.HasPrefix(s, "gif"), strings.HasPrefix(s, "nsgif"):
		return "gif"
	case strings.HasPrefix(s, "svg"):
		return "svg"
	}
	return s
}

// Size is how Spec's box is filled (libvips's VipsSize).
type Size int

const (
	// Fit scales to fit inside the box, up or down, keeping the aspect ratio.
	Fit Size = 0
	// FitDown is Fit without enlarging.
	FitDown Size = 2
	// Force scales to exactly the box, aspect ratio not kept.
	Force Size = 3
)

// Spec says how Decode produces pixels.
type Spec struct {
	// Width and Height, both > 0, make Decode a vips_thumbnail to that box (shrink on
	// load: JPEG DCT scaling, scaled WebP and HEIF decode), filled as Size says; resampling
	// is libvips's reduce with the Lanczos3 kernel. 0 and 0: the whole image.
	Width, Height int
	Size          Size
	// KeepAlpha returns 4 bands, straight (not premultiplied) alpha; otherwise alpha is
	// flattened onto Background and 3 bands come back.
	KeepAlpha  bool
	Background [3]uint8
}

// Image is decoded pixels: Height rows of Width*Bands bytes, sRGB, upright.
type Image struct {
	Pix                  []byte
	Width, Height, Bands int
}

// Decode loads data as spec says: upright (EXIF orientation applied), imported to sRGB
// (ICC profiles, CMYK, grey), 8 bits per sample (16-bit scaled down), alpha flattened or
// kept. A truncated or corrupt file is unsupported_image; Decode does no pixel-count
// check of its own (read Header first).
func (l *Lib) Decode(data []byte, spec Spec) (Image, error) {
	b := newCBuf(data)
	defer b.free()
	return l.decode(b, spec, nil)
}

func (l *Lib) decode(b cbuf, spec Spec, hd *Header) (Image, error) {
	s := C.ob_spec{width: C.int(spec.Width), height: C.int(spec.Height), size: C.int(spec.Size), fail_on: 1}
	if hd != nil && hd.Width > 0 && hd.Height > 0 {
		s.hdr_width, s.hdr_height, s.hdr_orientation = C.int(hd.Width), C.int(hd.Height), C.int(hd.Orientation)
		if hd.Loader == "VipsForeignLoadJpegBuffer" {
			s.hdr_jpeg = 1
		}
	}
	if spec.Width <= 0 || spec.Height <= 0 {
		s.width, s.height = 0, 0
	}
	if spec.KeepAlpha {
		s.keep_alpha = 1
	}
	for i, v := range spec.Background {
		s.background[i] = C.double(v)
	}
	var out unsafe.Pointer
	var w, h, bands C.int
	switch C.ob_decode_buffer(b.p, b.n, &s, &out, &w, &h, &bands) {
	case 0:
	case -3:
		lastError()
		return Image{}, codec.Errorf(codec.CodeUnsupportedImage, "libvips gave an image of an unexpected layout")
	default:
		return Image{}, codec.Errorf(codec.CodeUnsupportedImage, "cannot decode the image: %s", lastError())
	}
	defer C.ob_free(out)
	n := int(w) * int(h) * int(bands)
	return Image{Pix: C.GoBytes(out, C.int(n)), Width: int(w), Height: int(h), Bands: int(bands)}, nil
}

// Load reads the header of data, refuses it when width*height is over maxPixels
// (image_too_large, with width, height and max_pixels as details) or when accept (if not
// nil) refuses the header, before any pixel is decoded, then decodes as spec says, the
// header read once.
func (l *Lib) Load(data []byte, maxPixels int64, spec Spec, accept func(Header) error) (Image, Header, error) {
	b := newCBuf(data)
	defer b.free()
	hd, err := l.header(b)
	if err != nil {
		return Image{}, Header{}, err
	}
	if accept != nil {
		if err := accept(hd); err != nil {
			return Image{}, hd, err
		}
	}
	if hd.Width <= 0 || hd.Height <= 0 {
		return Image{}, hd, codec.Errorf(codec.CodeUnsupportedImage, "the image declares an empty size %dx%d", hd.Width, hd.Height)
	}
	if px := int64(hd.Width) * int64(hd.Height); px > maxPixels {
		return Image{}, hd, codec.Errorf(codec.CodeImageTooLarge, "the image is %dx%d = %d pixels, over the limit of %d",
			hd.Width, hd.Height, px, maxPixels).With("width", hd.Width).With("height", hd.Height).With("max_pixels", maxPixels)
	}
	img, err := l.decode(b, spec, &hd)
	if err != nil {
		return Image{}, hd, err
	}
	uw, uh := hd.Upright()
	if spec.Width <= 0 && (img.Width != uw || img.Height != uh) {
		return Image{}, hd, codec.Errorf(codec.CodeUnsupportedImage, "the image decoded to %dx%d, not the %dx%d its header declares", img.Width, img.Height, uw, uh)
	}
	return img, hd, nil
}

// Encode writes pixels (w*h*bands bytes, bands 1-4, uchar) as the image format of suffix,
// which may carry libvips's save options (".jpg[Q=90,interlace]", ".png[palette]",
// ".avif", ".tif", ".gif", ".webp"). to, when not "", converts first: "cmyk", "b-w",
// "rgb16", "grey16". orientation > 0 sets the EXIF orientation tag. For tests and the
// benchmark's generated library.
func (l *Lib) Encode(pix []byte, w, h, bands int, suffix, to string, orientation int) ([]byte, error) {
	return l.EncodePages(pix, w, h, bands, 0, suffix, to, orientation)
}

// EncodePages is Encode of an image made of pages pageHeight high (stacked from the top):
// an animation for ".gif" and ".webp", a multi-page TIFF for ".tif". 0 is one page.
func (l *Lib) EncodePages(pix []byte, w, h, bands, pageHeight int, suffix, to string, orientation int) ([]byte, error) {
	if pageHeight < 0 || (pageHeight > 0 && h%pageHeight != 0) {
		return nil, fmt.Errorf("vips: Encode: page height %d does not divide %d", pageHeight, h)
	}
	if bands < 1 || bands > 4 || w <= 0 || h <= 0 || len(pix) < w*h*bands {
		return nil, fmt.Errorf("vips: Encode: %d bytes is not %dx%dx%d", len(pix), w, h, bands)
	}
	interp := map[string]int{"": 0, "cmyk": 15, "b-w": 1, "rgb16": 25, "grey16": 26}
	cs, ok := interp[to]
	if !ok {
		return nil, fmt.Errorf("vips: Encode: unknown colourspace %q", to)
	}
	b := newCBuf(pix[:w*h*bands])
	defer b.free()
	csuf := C.CString(suffix)
	defer C.free(unsafe.Pointer(csuf))
	var out unsafe.Pointer
	var n C.size_t
	if C.ob_encode(b.p, C.int(w), C.int(h), C.int(bands), csuf, C.int(cs), C.int(orientation), C.int(pageHeight), &out, &n) != 0 {
		return nil, fmt.Errorf("vips: saving %s: %s", suffix, lastError())
	}
	defer C.ob_free(out)
	return C.GoBytes(out, C.int(n)), nil
}

// FormatProbe is whether this libvips loads one format: Loads when a small image of it,
// written by libvips, loads back (or, for a format libvips cannot write, when its loader
// exists); Why says what failed otherwise.
type FormatProbe struct {
	Format string `json:"format"`
	Loader string `json:"loader"`
	Loads  bool   `json:"loads"`
	Why    string `json:"why,omitempty"`
}

// probes are the formats Probe checks: the loader's nickname and, when libvips can write
// the format, the suffix that writes a probe file.
var probes = []struct{ format, loader, suffix string }{
	{"JPEG", "jpegload_buffer", ".jpg"},
	{"PNG", "pngload_buffer", ".png"},
	{"WebP", "webpload_buffer", ".webp"},
	{"AVIF (HEIF, AV1)", "heifload_buffer", ".avif"},
	{"HEIC (HEIF, HEVC)", "heifload_buffer", ".heic[compression=hevc]"},
	{"TIFF", "tiffload_buffer", ".tif"},
	{"GIF", "gifload_buffer", ".gif"},
	{"JPEG XL", "jxlload_buffer", ".jxl"},
	{"JPEG 2000", "jp2kload_buffer", ".jp2"},
	{"SVG", "svgload_buffer", ""},
	{"PDF", "pdfload_buffer", ""},
	{"ImageMagick's formats (BMP, ...)", "magickload_buffer", ""},
}

// Probe checks each format of the list above: its loader, and a round trip where libvips
// can write the format (so HEIC counts only where libheif has a HEVC codec).
func (l *Lib) Probe() []FormatProbe {
	out := make([]FormatProbe, 0, len(probes))
	pix := make([]byte, 16*16*3)
	for i := range pix {
		pix[i] = byte(i * 7)
	}
	for _, p := range probes {
		r := FormatProbe{Format: p.format, Loader: strings.TrimSuffix(p.loader, "_buffer")}
		switch {
		case !l.HasLoader(p.loader):
			r.Why = "no " + r.Loader + " in this build"
		case p.suffix == "":
			r.Loads = true
		default:
			data, err := l.Encode(pix, 16, 16, 3, p.suffix, "", 0)
			if err != nil {
				r.Why = "a probe file cannot be written (" + firstLine(err.Error()) + ")"
				break
			}
			if _, err := l.Decode(data, Spec{}); err != nil {
				r.Why = firstLine(err.Error())
				break
			}
			r.Loads = true
		}
		out = append(out, r)
	}
	return out
}

func firstLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// HasLoader reports whether this libvips has the load operation nickname ("jpegload").
func (l *Lib) HasLoader(nickname string) bool {
	c := C.CString(nickname)
	defer C.free(unsafe.Pointer(c))
	return C.ob_has_loader(c) != 0
}
