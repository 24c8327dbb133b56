#!/usr/bin/env bash
# fetch-node-bench.sh DEST
#
# Installs the onnxruntime-node baseline of `ortbus bench throughput` (bench/node/):
#
#   DEST/node-bench/node_modules   onnxruntime-node 1.30.0 and its dependencies, exactly as
#                                  bench/node/package-lock.json pins them (`npm ci`), with
#                                  install scripts off: the package's postinstall only
#                                  downloads CUDA binaries, and the CPU binding and
#                                  libonnxruntime.so.1 are inside the package itself
#                                  (bin/napi-v6/linux/x64/), checked here against pinned
#                                  sha256s; and sharp 0.35.6 (the library bench's
#                                  sharp + onnxruntime-node alternative), whose prebuilt
#                                  binding @img/sharp-linux-x64 and libvips
#                                  @img/sharp-libvips-linux-x64 1.3.5 (libvips 8.18.8, the
#                                  library scripts/fetch-libvips.sh pins for the Go side)
#                                  are optional dependencies the lockfile pins: sharp needs
#                                  no install script; both checked against pinned sha256s
#   clients/ts/node_modules/bun    Bun, the runtime the app runs: the TypeScript client's
#                                  devDependency, installed the way test/tsclient_test.go
#                                  does (`npm ci` in clients/ts, then the bun package's own
#                                  install.js), only when its bun does not run yet
#
# Idempotent: what is in place and checks out is left alone. Writes
# DEST/node-bench/INSTALLED (the versions) last.
set -euo pipefail

dest=${1:?usage: fetch-node-bench.sh DEST}
repo=$(cd "$(dirname "$0")/.." && pwd)
src="$repo/bench/node"
dir="$dest/node-bench"
version=1.30.0
sharp_version=0.35.6
# sha256 of bin/napi-v6/linux/x64/* inside onnxruntime-node@1.30.0 (the library is the one
# scripts/fetch-runtime.sh pins for the Go side).
declare -A pinned=(
  [libonnxruntime.so.1]=ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23
  [onnxruntime_binding.node]=ccdc60b981d93a490cf9513d3f583547252b6e285b72988a96a494f2f006c7b8
)
bin="$dir/node_modules/onnxruntime-node/bin/napi-v6/linux/x64"
# sha256 of sharp@0.35.6's prebuilt binding and of its libvips (the same file as
# .deps/libvips-8.18.8/lib/libvips-cpp.so.8.18.8), paths under node_modules/@img.
declare -A sharp_pinned=(
  [sharp-linux-x64/lib/sharp-linux-x64-$sharp_version.node]=17355ad40b4693e1a743b384211bb807309080d243fb59fd908fb92faab364ab
  [sharp-libvips-linux-x64/lib/libvips-cpp.so.8.18.8]=b0c697d2c03b0da57649e2243be4b2a42c7f35a28c7fc97dfda94b22c26869cc
)
img="$dir/node_modules/@img"
bun="$repo/clients/ts/node_modules/bun/bin/bun.exe"

need() { command -v "$1" >/dev/null || { echo "fetch-node-bench: $1 is not installed; it is needed $2" >&2; exit 1; }; }

checked() {
  for f in "${!pinned[@]}"; do
    echo "${pinned[$f]}  $bin/$f" | sha256sum -c --quiet - >/dev/null 2>&1 || return 1
  done
  for f in "${!sharp_pinned[@]}"; do
    echo "${sharp_pinned[$f]}  $img/$f" | sha256sum -c --quiet - >/dev/null 2>&1 || return 1
  done
  cmp -s "$src/package-lock.json" "$dir/package-lock.json"
}

bun_runs() { [ -x "$bun" ] && timeout 30 "$bun" --version >/dev/null 2>&1; }

# onnxruntime-node and sharp, from the lockfile.
if ! checked; then
  need npm "to install onnxruntime-node@$version and sharp@$sharp_version"
  echo "fetch-node-bench: onnxruntime-node@$version, sharp@$sharp_version -> $dir/node_modules" >&2
  mkdir -p "$dir"
  rm -f "$dir/INSTALLED"
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  if ! (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error \
        --fetch-retries=2 --fetch-retry-mintimeout=1000 --fetch-retry-maxtimeout=5000 >npm.log 2>&1); then
    echo "fetch-node-bench: npm ci failed (is the npm registry reachable?" \
      "registry: $(npm config get registry 2>/dev/null)):" >&2
    grep -m 6 'npm error' "$dir/npm.log" | sed 's/^/  /' >&2
    exit 1
  fi
  for f in "${!pinned[@]}"; do
    echo "${pinned[$f]}  $bin/$f" | sha256sum -c --quiet - ||
      { echo "fetch-node-bench: checksum mismatch for onnxruntime-node@$version $f" >&2; exit 1; }
  done
  for f in "${!sharp_pinned[@]}"; do
    echo "${sharp_pinned[$f]}  $img/$f" | sha256sum -c --quiet - ||
      { echo "fetch-node-bench: checksum mismatch for sharp@$sharp_version's @img/$f" >&2; exit 1; }
  done
fi

# Bun, as test/tsclient_test.go installs it.
if ! bun_runs; then
  need npm "to install Bun (clients/ts's devDependency)"
  need node "to run the bun package's install.js"
  echo "fetch-node-bench: Bun -> $bun" >&2
  (cd "$repo/clients/ts" && npm ci --no-audit --no-fund --loglevel=error)
  (cd "$repo/clients/ts/node_modules/bun" && node install.js)
  bun_runs || { echo "fetch-node-bench: $bun does not run after npm ci and the bun package's install.js" >&2; exit 1; }
fi

# The bindings load under Bun (the benches' check, here once at install time).
if ! out=$(cd "$dir" && timeout 60 "$bun" -e 'const o = require("onnxruntime-node"); console.log(o.env.versions.node)' 2>&1); then
  echo "fetch-node-bench: Bun cannot load onnxruntime-node:" >&2
  echo "$out" | tail -n 5 | sed 's/^/  /' >&2
  exit 1
fi
if ! sv=$(cd "$dir" && timeout 60 "$bun" -e 'const s = require("sharp"); console.log(s.versions.sharp + " " + s.versions.vips)' 2>&1) ||
   [ "$sv" != "$sharp_version 8.18.8" ]; then
  echo "fetch-node-bench: Bun cannot load sharp@$sharp_version with libvips 8.18.8:" >&2
  echo "$sv" | tail -n 5 | sed 's/^/  /' >&2
  exit 1
fi
printf 'onnxruntime-node %s\nsharp %s\nbun %s\n' "$out" "${sv/ / libvips }" "$("$bun" --version)" >"$dir/INSTALLED"
