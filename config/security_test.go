package config

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSecurityOutputsAndLimits: output_roots (resolved like allowed_roots), the image
// byte limit and the spool's maximum age, with their defaults and their refusals.
func TestSecurityOutputsAndLimits(t *testing.T) {
	c, err := Load(write(t, good))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Security
	if s.MaxImageBytes != DefaultMaxImageBytes || s.SpoolMaxAge.D() != time.Hour || s.MaxImagePixels != DefaultMaxImagePixels {
		t.Fatalf("defaults: max_image_bytes %d spool_max_age %v max_image_pixels %d", s.MaxImageBytes, s.SpoolMaxAge.D(), s.MaxImagePixels)
	}
	if got := s.WriteRoots(); len(got) != 1 || got[0] != s.SpoolDir {
		t.Fatalf("write roots without output_roots = %v, want the spool dir %s", got, s.SpoolDir)
	}

	text := strings.Replace(good, `spool_dir = "images/spool"`,
		"spool_dir = \"images/spool\"\noutput_roots = [\"out\", \"/srv/masks\"]\nmax_image_bytes = \"16MiB\"\nspool_max_age = \"0s\"", 1)
	p := write(t, text)
	c, err = Load(p)
	if err != nil {
		t.Fatal(err)
	}
	s = c.Security
	dir := filepath.Dir(p)
	if want := []string{filepath.Join(dir, "out"), "/srv/masks"}; !slices.Equal(s.OutputRoots, want) {
		t.Errorf("output_roots = %v, want %v", s.OutputRoots, want)
	}
	if want := []string{filepath.Join(dir, "images/spool"), filepath.Join(dir, "out"), "/srv/masks"}; !slices.Equal(s.WriteRoots(), want) {
		t.Errorf("write roots = %v, want %v", s.WriteRoots(), want)
	}
	if s.MaxImageBytes != 16<<20 {
		t.Errorf("max_image_bytes = %d", s.MaxImageBytes)
	}
	if s.SpoolMaxAge != 0 {
		t.Errorf("spool_max_age = \"0s\" gave %v, want 0 (never)", s.SpoolMaxAge.D())
	}

	for i, tc := range []struct{ line, want string }{
		{`spool_max_age = "-1s"`, "security.spool_max_age: must not be negative"},
		{`spool_max_age = "soon"`, "not a duration"},
		{`max_image_bytes = "lots"`, "not a size"},
		{`output_roots = [""]`, "security.output_roots"},
		{`output_roots = ["/"]`, "security.output_roots"},
	} {
		text := strings.Replace(good, `spool_dir = "images/spool"`, "spool_dir = \"images/spool\"\n"+tc.line, 1)
		if _, err := Load(write(t, text)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("case %d (%s): %v, want an error with %q", i, tc.line, err, tc.want)
		}
	}
}
