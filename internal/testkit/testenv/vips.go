package testenv

import (
	"testing"

	"github.com/ortbus/ortbus/images/vips"
)

// RequireVips returns the libvips of this process (vips.Default: $ORTBUS_LIBVIPS, else
// .deps/libvips-*/lib, which `make prepare` fills). Where there is none, t is skipped,
// saying so and what installs it — or failed under CI (CI set), where `make test` has
// fetched it first and its absence is a fault.
func RequireVips(t testing.TB) *vips.Lib {
	t.Helper()
	l, err := vips.Default()
	if err != nil {
		skipOrFailBecause(t, "libvips is not installed: run `make prepare` (scripts/fetch-libvips.sh .deps): "+err.Error())
	}
	return l
}
