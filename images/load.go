package images

import (
	"bytes"
	"image"
	"image/color"
	"strings"
	"sync"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/images/vips"
)

// Fill is how Load fits an image into its box (see LoadSpec).
type Fill = vips.Size

const (
	// FillFit scales to fit inside the box, keeping the aspect ratio, up or down.
	FillFit = vips.Fit
	// FillFitDown is FillFit without enlarging.
	FillFitDown = vips.FitDown
	// FillForce scales to exactly the box (aspect ratio not kept).
	FillForce = vips.Force
)

// LoadSpec says how a model kind wants its input loaded: Width×Height > 0 loads it
// straight to that box (libvips's vips_thumbnail: shrink on load, then Lanczos3), 0×0 at
// full size; KeepAlpha keeps transparency (an *image.NRGBA), otherwise alpha is flattened
// onto Background (an opaque *image.RGBA).
type LoadSpec struct {
	Width, Height int
	Fill          Fill
	KeepAlpha     bool
	Background    color.RGBA
}

// LoadFormats are the formats Load accepts (Info.Format), when the libvips build loads
// them: others libvips knows (SVG, PDF, ...) are refused, so the set a client can rely on
// does not depend on how libvips was built beyond these, and hostile input meets fewer
// parsers. BMP, which sharp's libvips has no loader for, is decoded by Go's x/image/bmp.
var LoadFormats = []string{"jpeg", "png", "webp", "heif", "tiff", "gif", "jxl", "bmp"}

// Load is how the model kinds read their input: the path checks and the bounded read of
// Open, then libvips. Its header is read first, without decoding pixels, and a
// width*height over MaxPixels is refused (image_too_large) before any decode, for every
// format; then the image is decoded as spec says: upright (the EXIF orientation applied:
// an orientation-6 photo comes back as the viewer shows it), imported to sRGB (ICC
// profiles, CMYK, grey), 8 bits per sample. A GIF, an animated WebP or a multi-page TIFF
// gives its first frame. Info gives the upright size of the whole image (not of the box
// it was loaded to). Errors are Open's; a missing libvips is runtime_missing.
func (p Policy) Load(path string, spec LoadSpec) (image.Image, Info, error) {
	if p.Reference {
		return p.Open(path)
	}
	buf := fileBufs.get()
	data, resolved, err := p.readInto(path, buf)
	if err != nil {
		fileBufs.put(buf)
		return nil, Info{}, err
	}
	img, info, err := load(data, p.maxPixels(), spec, path)
	fileBufs.put(data) // nothing Load returns refers to the file's bytes
	if err != nil {
		return nil, Info{}, withPath(err, path)
	}
	info.Path = resolved
	return img, info, nil
}

// LoadBytes is Load for bytes already in memory (no path policy): maxPixels <= 0 means
// DefaultMaxPixels, and data over DefaultMaxBytes is refused. For benchmarks and fuzzing.
func LoadBytes(data []byte, maxPixels int64, spec LoadSpec) (image.Image, Info, error) {
	if maxPixels <= 0 {
		maxPixels = DefaultMaxPixels
	}
	if int64(len(data)) > DefaultMaxBytes {
		return nil, Info{}, codec.Errorf(codec.CodeImageTooLarge, "image is %d bytes, over the limit of %d bytes", len(data), DefaultMaxBytes).
			With("bytes", len(data)).With("max_bytes", DefaultMaxBytes)
	}
	return load(data, maxPixels, spec, "image")
}

func load(data []byte, maxPixels int64, spec LoadSpec, name string) (image.Image, Info, error) {
	lib, err := vips.Default()
	if err != nil {
		return nil, Info{}, err
	}
	vs := vips.Spec{Width: spec.Width, Height: spec.Height, Size: spec.Fill, KeepAlpha: spec.KeepAlpha,
		Background: [3]uint8{spec.Background.R, spec.Background.G, spec.Background.B}}
	if vs.Width <= 0 || vs.Height <= 0 {
		vs.Width, vs.Height = 0, 0
	}
	// Go's header readers first, where they know the format (PNG, JPEG, GIF, BMP, WebP):
	// they need only the header's bytes, so a bomb that is all header is refused as too
	// large even where libvips's loader wants more of the file to read its header.
	if cfg, _, err := image.DecodeConfig(bytes.NewReader(data)); err == nil {
		if px := int64(cfg.Width) * int64(cfg.Height); px > maxPixels {
			return nil, Info{}, codec.Errorf(codec.CodeImageTooLarge,
				"%s is %dx%d = %d pixels, over the limit of %d", name, cfg.Width, cfg.Height, px, maxPixels).
				With("width", cfg.Width).With("height", cfg.Height).With("max_pixels", maxPixels)
		}
	}
	px, hd, err := lib.Load(data, maxPixels, vs, func(hd vips.Header) error {
		if !accepted(hd.Format) {
			return codec.Errorf(codec.CodeUnsupportedImage, "%s is a %s image; accepted are %s", name, hd.Format,
				strings.Join(LoadFormats, ", ")).With("format", hd.Format)
		}
		return nil
	})
	if err != nil && hd.Loader == "" && isBMP(data) {
		// No BMP loader in sharp's libvips (the header unreadable): Go's decoder, with
		// Open's checks.
		img, info, err := decode(data, maxPixels, name)
		if err == nil && info.Format != "bmp" {
			err = codec.Errorf(codec.CodeUnsupportedImage, "%s changed format while being read", name)
		}
		return img, info, err
	}
	if err != nil {
		if hd.Loader != "" && !accepted(hd.Format) {
			return nil, Info{}, err // its message names the image already
		}
		return nil, Info{}, named(err, name)
	}
	w, h := hd.Upright()
	info := Info{Format: hd.Format, Width: w, Height: h}
	r := image.Rect(0, 0, px.Width, px.Height)
	if px.Bands == 4 {
		return &image.NRGBA{Pix: px.Pix, Stride: 4 * px.Width, Rect: r}, info, nil
	}
	rgba := image.NewRGBA(r)
	d, s := rgba.Pix, px.Pix
	for i, j := 0, 0; j+2 < len(s); i, j = i+4, j+3 {
		d[i], d[i+1], d[i+2], d[i+3] = s[j], s[j+1], s[j+2], 255
	}
	return rgba, info, nil
}

// fileBufs are the file buffers Load reads into, kept between items: a 12 MP photo is
// 5-7 MB, which read into fresh memory every item is that many bytes zeroed and faulted
// in (and later scavenged) again. A buffer over maxKeptFileBuf is not kept; the pool
// drops what it holds at garbage collections.
var fileBufs = bufPool{}

const maxKeptFileBuf = 32 << 20

type bufPool struct{ p sync.Pool }

func (b *bufPool) get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return nil
}

func (b *bufPool) put(buf []byte) {
	if buf == nil || cap(buf) > maxKeptFileBuf {
		return
	}
	buf = buf[:0]
	b.p.Put(&buf)
}

func accepted(format string) bool {
	for _, f := range LoadFormats {
		if f == format {
			return true
		}
	}
	return format == "uhdr" // an Ultra HDR JPEG: its SDR image
}

func isBMP(data []byte) bool { return bytes.HasPrefix(data, []byte("BM")) }

// named puts the image's name in front of a libvips error's message.
func named(err error, name string) error {
	e := codec.AsError(err)
	if e.Code == codec.CodeRuntimeMissing {
		return e
	}
	out := *e
	out.Message = name + ": " + e.Message
	return &out
}
