#!/usr/bin/env bash
# fetch-llm-tenant.sh DEST
#
# Installs the LLM tenant's engine (tenants/llm/): node-llama-cpp and its prebuilt
# llama.cpp binaries for Linux x64, CPU (@node-llama-cpp/linux-x64) and Vulkan
# (@node-llama-cpp/linux-x64-vulkan), exactly as tenants/llm/package-lock.json pins them
# (`npm ci`: every tarball checked against the lockfile's integrity hash), into
#
#   DEST/llm-tenant/node_modules
#
# --omit=optional leaves out node-llama-cpp's other prebuilt binaries (CUDA: about 540 MB,
# and other platforms'); the two above are direct dependencies of tenants/llm, so they
# stay. Install scripts are off (--ignore-scripts, and NODE_LLAMA_CPP_SKIP_DOWNLOAD for
# good measure): node-llama-cpp's postinstall would otherwise look for a binary and
# download and build llama.cpp from source when none fits. The tenant loads with
# build "never", so it only ever uses a prebuilt binary; this script checks that the CPU
# one loads here (the tenant's -check: buildType "prebuilt") before writing
# DEST/llm-tenant/INSTALLED (its check line and node's version), last.
#
# Idempotent: an install from the same lockfile that has its INSTALLED is left alone.
set -euo pipefail

dest=${1:?usage: fetch-llm-tenant.sh DEST}
repo=$(cd "$(dirname "$0")/.." && pwd)
src="$repo/tenants/llm"
dir="$dest/llm-tenant"

need() { command -v "$1" >/dev/null || { echo "fetch-llm-tenant: $1 is not installed; it is needed $2" >&2; exit 1; }; }

if [ -f "$dir/INSTALLED" ] && cmp -s "$src/package-lock.json" "$dir/package-lock.json"; then
  exit 0
fi
need node "to run the tenant (node-llama-cpp needs Node.js 20 or newer)"
need npm "to install node-llama-cpp"
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "fetch-llm-tenant: node-llama-cpp needs Node.js 20 or newer; this node is $(node --version)" >&2
  exit 1
fi

echo "fetch-llm-tenant: node-llama-cpp (tenants/llm/package-lock.json) -> $dir/node_modules" >&2
mkdir -p "$dir"
rm -f "$dir/INSTALLED"
cp "$src/package.json" "$src/package-lock.json" "$dir/"
if ! (cd "$dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --omit=optional --ignore-scripts --no-audit --no-fund \
      --loglevel=error --fetch-retries=2 --fetch-retry-mintimeout=1000 --fetch-retry-maxtimeout=5000 >npm.log 2>&1); then
  echo "fetch-llm-tenant: npm ci failed (is the npm registry reachable?" \
    "registry: $(npm config get registry 2>/dev/null)):" >&2
  grep -m 6 'npm error' "$dir/npm.log" | sed 's/^/  /' >&2
  exit 1
fi

# The prebuilt CPU binary loads, and is what is used (never a build): the tenant's own
# -check, which prints {"event":"check","build":"prebuilt",...}.
if ! out=$(NODE_LLAMA_CPP_SKIP_DOWNLOAD=true timeout 120 node "$src/tenant.mjs" -modules "$dir/node_modules" -check 2>&1) ||
   ! grep -q '"build":"prebuilt"' <<<"$out"; then
  echo "fetch-llm-tenant: node-llama-cpp's prebuilt CPU binary does not load:" >&2
  echo "$out" | tail -n 5 | sed 's/^/  /' >&2
  exit 1
fi
printf '%s\nnode %s\n' "$(grep '"event":"check"' <<<"$out")" "$(node --version)" >"$dir/INSTALLED"
