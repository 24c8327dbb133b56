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
#                                  sha256s
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
# sha256 of bin/napi-v6/linux/x64/* inside onnxruntime-node@1.30.0 (the library is the one
# scripts/fetch-runtime.sh pins for the Go side).
declare -A pinned=(
  [libonnxruntime.so.1]=ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23
  [onnxruntime_binding.node]=ccdc60b981d93a490cf9513d3f583547252b6e285b72988a96a494f2f006c7b8
)
bin="$dir/node_modules/onnxruntime-node/bin/napi-v6/linux/x64"
bun="$repo/clients/ts/node_modules/bun/bin/bun.exe"

need() { command -v "$1" >/dev/null || { echo "fetch-node-bench: $1 is not installed; it is needed $2" >&2; exit 1; }; }

checked() {
  for f in "${!pinned[@]}"; do
    echo "${pinned[$f]}  $bin/$f" | sha256sum -c --quiet - >/dev/null 2>&1 || return 1
  done
  cmp -s "$src/package-lock.json" "$dir/package-lock.json"
}

bun_runs() { [ -x "$bun" ] && timeout 30 "$bun" --version >/dev/null 2>&1; }

# onnxruntime-node, from the lockfile.
if ! checked; then
  need npm "to install onnxruntime-node@$version"
  echo "fetch-node-bench: onnxruntime-node@$version -> $dir/node_modules" >&2
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

# The binding loads under Bun (the bench's check, here once at install time).
if ! out=$(cd "$dir" && timeout 60 "$bun" -e 'const o = require("onnxruntime-node"); console.log(o.env.versions.node)' 2>&1); then
  echo "fetch-node-bench: Bun cannot load onnxruntime-node:" >&2
  echo "$out" | tail -n 5 | sed 's/^/  /' >&2
  exit 1
fi
printf 'onnxruntime-node %s\nbun %s\n' "$out" "$("$bun" --version)" >"$dir/INSTALLED"
