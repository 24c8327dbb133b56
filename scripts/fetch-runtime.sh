#!/usr/bin/env bash
# fetch-runtime.sh DEST VERSION...
#
# Puts ONNX Runtime's Linux x64 shared library of each VERSION into its own prefix,
# DEST/ort-VERSION/lib/libonnxruntime.so.1, taken from the npm package onnxruntime-node
# (`npm pack`, then only the one file is unpacked: no install scripts run).
# Idempotent: a library already in place with the pinned checksum is left alone.
set -euo pipefail

dest=${1:?usage: fetch-runtime.sh DEST VERSION...}
shift
[ $# -gt 0 ] || set -- 1.30.0 1.24.3

# sha256 of bin/napi-v6/linux/x64/libonnxruntime.so.1 inside each published package.
declare -A pinned=(
  [1.30.0]=ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23
  [1.24.3]=92ba8e44d31b80a34f5e805076a044122c3be1fffe0d88ed790de7267b0b2682
)
member=package/bin/napi-v6/linux/x64/libonnxruntime.so.1

for v in "$@"; do
  want=${pinned[$v]:-}
  lib="$dest/ort-$v/lib/libonnxruntime.so.1"
  if [ -f "$lib" ] && { [ -z "$want" ] || echo "$want  $lib" | sha256sum -c --quiet - 2>/dev/null; }; then
    continue
  fi
  command -v npm >/dev/null || { echo "fetch-runtime: npm is not installed; it is needed to fetch onnxruntime-node@$v" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch-runtime: onnxruntime-node@$v -> $lib" >&2
  if ! (cd "$tmp" && npm pack --silent "onnxruntime-node@$v" >pack.out 2>pack.err); then
    echo "fetch-runtime: npm could not fetch onnxruntime-node@$v (is the npm registry reachable?):" >&2
    sed 's/^/  /' "$tmp/pack.err" >&2
    exit 1
  fi
  tar -xzf "$tmp/onnxruntime-node-$v.tgz" -C "$tmp" "$member"
  if [ -n "$want" ]; then
    echo "$want  $tmp/$member" | sha256sum -c --quiet - || { echo "fetch-runtime: checksum mismatch for onnxruntime-node@$v" >&2; exit 1; }
  else
    echo "fetch-runtime: warning: no pinned checksum for $v; recording $(sha256sum "$tmp/$member" | cut -d' ' -f1)" >&2
  fi
  mkdir -p "$(dirname "$lib")"
  mv "$tmp/$member" "$lib.part" 2>/dev/null || cp "$tmp/$member" "$lib.part"
  mv "$lib.part" "$lib"
  echo "$v" >"$dest/ort-$v/VERSION"
  rm -rf "$tmp"
  trap - EXIT
done
