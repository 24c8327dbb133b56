package doctor

import (
	"fmt"
	"io"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/images/vips"
)

// ImagesReport is libvips's part of the report: the image pipeline of every model kind
// but raw, one per process (package images/vips), so probed once, in doctor's own process.
type ImagesReport struct {
	Searched []string `json:"searched"`
	Found    string   `json:"found,omitempty"`
	Version  string   `json:"version,omitempty"`
	Threads  int      `json:"threads,omitempty"`
	// Formats says, for each format probed, whether this libvips loads it, and why not.
	Formats []vips.FormatProbe `json:"formats,omitempty"`
	Error   *codec.Error       `json:"error,omitempty"`
	// Needed is whether the config has a model kind that reads images.
	Needed bool `json:"needed"`
}

// OK reports whether images can be served: libvips loaded, or not needed.
func (r *ImagesReport) OK() bool { return r.Error == nil || !r.Needed }

// ProbeImages finds and loads libvips (vips.Default) and probes each of vips.Loaders.
func ProbeImages(cfg *config.Config) *ImagesReport {
	r := &ImagesReport{Searched: vips.Candidates()}
	for _, m := range cfg.Models {
		if m != nil && m.Kind != config.KindRaw {
			r.Needed = true
		}
	}
	l, err := vips.Default()
	if err != nil {
		r.Error = codec.AsError(err)
		return r
	}
	r.Found, r.Version, r.Threads = l.Path, l.Version, l.Threads
	r.Formats = l.Probe()
	return r
}

// PrintImages writes the libvips report.
func PrintImages(w io.Writer, r *ImagesReport) {
	status := "ok"
	if !r.OK() {
		status = "FAIL"
	}
	fmt.Fprintf(w, "images (libvips)  %s\n", status)
	for _, s := range r.Searched {
		mark := "  "
		if s == r.Found {
			mark = "=>"
		}
		fmt.Fprintf(w, "  %s searched  %s\n", mark, s)
	}
	if r.Version != "" {
		fmt.Fprintf(w, "  libvips  %s (%s), %d thread(s) per decode, operation cache off\n", r.Version, r.Found, r.Threads)
	}
	for _, f := range r.Formats {
		if f.Loads {
			fmt.Fprintf(w, "  loads   %s (%s)\n", f.Format, f.Loader)
		} else {
			fmt.Fprintf(w, "  cannot  %s: %s\n", f.Format, f.Why)
		}
	}
	if r.Found != "" {
		fmt.Fprintf(w, "  accepts %s, where loaded (BMP decoded by Go; any other format is unsupported_image)\n", strings.Join(images.LoadFormats, ", "))
	}
	if r.Error != nil {
		fmt.Fprintf(w, "  error   %s: %s\n", r.Error.Code, r.Error.Message)
	}
}
