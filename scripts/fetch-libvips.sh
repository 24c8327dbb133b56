#!/usr/bin/env bash
# fetch-libvips.sh DEST [VERSION]
#
# Puts libvips (the image pipeline of every model kind) into DEST/libvips-VIPS/lib/, taken
# from sharp's prebuilt npm package @img/sharp-libvips-linux-x64 (`npm pack`, then only
# the lib/ folder is unpacked: no install scripts run, no root needed). The package's one
# library, libvips-cpp.so.8.x, holds libvips's C API with its codecs (mozjpeg, libspng,
# libwebp, libheif + aom for AVIF, libtiff, cgif, librsvg, lcms2, libexif) linked in.
# ortbus dlopen()s it at run time (package images/vips), so nothing is built against it.
# Idempotent: a library already in place is left alone; the tarball is checked against a
# pinned SHA-256 before anything is unpacked.
set -euo pipefail

dest=${1:?usage: fetch-libvips.sh DEST [PACKAGE_VERSION]}
pkgver=${2:-1.3.5}

# npm package version -> libvips version inside it, and the sha256 of the npm tarball.
declare -A vips=(
  [1.3.5]=8.18.8
)
declare -A pinned=(
  [1.3.5]=608d489355053a22215a3f6cf0f5741f907c3b5ff38b7fb5c9f4e84e8298e008
)
vv=${vips[$pkgver]:-}
want=${pinned[$pkgver]:-}
[ -n "$vv" ] && [ -n "$want" ] || { echo "fetch-libvips: no pinned libvips for @img/sharp-libvips-linux-x64@$pkgver (known: ${!pinned[*]})" >&2; exit 1; }

prefix="$dest/libvips-$vv"
lib="$prefix/lib/libvips-cpp.so.$vv"
if [ -f "$lib" ] && [ "$(cat "$prefix/PACKAGE" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "fetch-libvips: npm is not installed; it is needed to fetch @img/sharp-libvips-linux-x64@$pkgver" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-libvips: @img/sharp-libvips-linux-x64@$pkgver (libvips $vv) -> $prefix/lib" >&2
if ! (cd "$tmp" && npm pack --silent "@img/sharp-libvips-linux-x64@$pkgver" >pack.out 2>pack.err); then
  echo "fetch-libvips: npm could not fetch @img/sharp-libvips-linux-x64@$pkgver (is the npm registry reachable?):" >&2
  sed 's/^/  /' "$tmp/pack.err" >&2
  exit 1
fi
tgz="$tmp/img-sharp-libvips-linux-x64-$pkgver.tgz"
echo "$want  $tgz" | sha256sum -c --quiet - || { echo "fetch-libvips: checksum mismatch for @img/sharp-libvips-linux-x64@$pkgver" >&2; exit 1; }
tar -xzf "$tgz" -C "$tmp" package/lib package/versions.json
[ -f "$tmp/package/lib/libvips-cpp.so.$vv" ] || { echo "fetch-libvips: the package has no lib/libvips-cpp.so.$vv" >&2; exit 1; }
mkdir -p "$dest"
rm -rf "$prefix.part"
mkdir -p "$prefix.part"
mv "$tmp/package/lib" "$prefix.part/lib"
cp "$tmp/package/versions.json" "$prefix.part/versions.json"
echo "$want" >"$prefix.part/PACKAGE"
echo "$vv" >"$prefix.part/VERSION"
rm -rf "$prefix"
mv "$prefix.part" "$prefix"
