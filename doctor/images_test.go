package doctor_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/doctor"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestProbeImages: doctor names the libvips it loaded, its version, and per format
// whether it loads (JPEG, PNG, WebP, TIFF and GIF do in every build ortbus installs; JPEG
// 2000 in none), and lists them.
func TestProbeImages(t *testing.T) {
	l := testenv.RequireVips(t)
	cfg := &config.Config{Models: map[string]*config.Model{"t": {Name: "t", Kind: config.KindTaggerPixAI}}}
	r := doctor.ProbeImages(cfg)
	if !r.OK() || !r.Needed || r.Found != l.Path || r.Version != l.Version {
		t.Fatalf("report %+v", r)
	}
	loads := map[string]bool{}
	for _, f := range r.Formats {
		loads[f.Format] = f.Loads
		if !f.Loads && f.Why == "" {
			t.Errorf("%s: cannot, with no reason", f.Format)
		}
	}
	for _, f := range []string{"JPEG", "PNG", "WebP", "TIFF", "GIF"} {
		if !loads[f] {
			t.Errorf("%s does not load: %+v", f, r.Formats)
		}
	}
	if loads["JPEG 2000"] {
		t.Errorf("JPEG 2000 loads in sharp's libvips, which has no jp2kload")
	}
	var buf bytes.Buffer
	doctor.PrintImages(&buf, r)
	for _, want := range []string{"images (libvips)  ok", "libvips  " + l.Version, "loads   JPEG (jpegload)", "cannot  JPEG 2000: no jp2kload"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("listing lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestPrintImagesMissing: a missing libvips fails doctor when a model reads images, with
// every place searched; a raw-only config does not need it.
func TestPrintImagesMissing(t *testing.T) {
	r := &doctor.ImagesReport{Searched: []string{"/a/libvips-cpp.so.8.18.8"}, Needed: true,
		Error: codec.Errorf(codec.CodeRuntimeMissing, "libvips not found (run `make prepare`)")}
	if r.OK() {
		t.Fatal("a missing libvips is OK")
	}
	var buf bytes.Buffer
	doctor.PrintImages(&buf, r)
	for _, want := range []string{"images (libvips)  FAIL", "searched  /a/libvips-cpp.so.8.18.8", "error   runtime_missing: libvips not found (run `make prepare`)"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("listing lacks %q:\n%s", want, buf.String())
		}
	}
	r.Needed = false
	if !r.OK() {
		t.Error("a raw-only config needs libvips")
	}
}
