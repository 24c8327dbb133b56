#!/usr/bin/env bash
# gpu-check.sh [OUT_DIR]      (or OUT=DIR scripts/gpu-check.sh)
#
# Issue 31's figures for ONNX Runtime's WebGPU EP on an NVIDIA GPU, and issue 32's
# collision on it: what a person with one runs after `make prepare` and `make build` (and
# `make ocr-model`, `make node-bench` for the detector and the onnxruntime-node column;
# `make vad-model llm-tenant` for the collision). Steps:
#
#   (a) bin/ortbus doctor on a generated config whose pool `gpu` runs the PP-OCRv4 detector
#       (.deps/ocr/ppocrv4-det; without it, the generated tagger-heavy as a raw model) on
#       ep = "webgpu", device = "cuda:0";
#   (b) bin/ortbus tune -ep webgpu on that pool (its layouts: workers 1..4 × max_batch), then
#       bin/ortbus bench throughput -ep webgpu -device cuda:0 with the layout tune picked:
#       the system vs the in-process WebGPU loop vs onnxruntime-node's webgpu, side by side;
#   (c) a gateway on the config (the winner's workers): each worker's device memory as
#       `ortbus status` reports it (device_bytes; each model's peak_bytes, peak_source),
#       checked independently (issue 41, item 2: bin/ortbus bench memcheck): their sum
#       against the GPU's own memory.used, read before the gateway starts and with the
#       workers loaded, less what the other processes on the GPU grew by, within 10%
#       (nvidia-smi's per-process figure is shown beside each worker, for reading only:
#       device_bytes is that very figure);
#   (d) issue 32's collision on the GPU (COLLISION=0 skips it; it needs `make vad-model
#       llm-tenant` too): bin/ortbus bench collision -scenario gpu — Silero VAD, PP-OCRv4 det
#       and the tagger flood on webgpu pools of the GPU, llama.cpp generating on it (Vulkan)
#       under ortbus lease, with and without --gate, and the degrade run; its "target
#       missed" notes (urgent p95 <= 1.5x solo and 0 frames dropped with the gate, the GPU's
#       peak within its budget, 0 requests lost) are failures; before it, (d0) issue 41's
#       bin/ortbus bench profile -scenario gpu (PROFILE=0 skips it, a failure): each service
#       alone, its p95, items/s, CPU %, idle and peak memory (the GPU's, per process) and
#       power (nvidia-smi power.draw; RAPL for the CPU), a service without a power
#       reading failing as not measured;
#   (f) the lease's free -> grant, on the GPU's memory (bin/ortbus bench lease -n 3 -ep
#       webgpu: the holder's memory is a WebGPU session's initializers in a child process,
#       measured by nvidia-smi, the adapter checked to be the GPU) and on the host's
#       (bin/ortbus bench lease -n 3);
#   (b') the memory check of item 2 in the GPU benches too: every tune layout's and the
#       throughput system's workers against the GPU's growth (their "memory check" lines,
#       a target of the throughput report);
#   (e) exit 1 where a figure falls short of the issues' targets: the system >= 1.0x the
#       in-process WebGPU loop and >= 1.0x onnxruntime-node's webgpu (the bench's "target
#       missed" notes), the workers' device_bytes within 10% of the GPU's own growth, each
#       model's peak measured on the device; exit 2 when it cannot run at all (no NVIDIA
#       GPU, no Vulkan loader, nothing built).
#
# One window holds it (issue 41, item 7): every step runs within WINDOW_S seconds from the
# start (default 480, 8 minutes; each step under `timeout` for what is left), a step cut
# short failing as such; summary.txt is one table of every step (its time, each target's
# figure or why not, its verdict), with the figures that need another vendor's GPU (AMD,
# Intel: drm:N) listed as such.
#
# Not measured is not a pass: a target a step did not measure (a bench's "not measured",
# "targets not judged" or "no driver memory reading", COLLISION=0, or a figure absent
# from its JSON report: bin/ortbus bench unmeasured) fails it, named. And
# the adapter is the GPU: where the Vulkan adapter the paths run on is not the GPU
# nvidia-smi names (llvmpipe, lavapipe's CPU device, beside an NVIDIA GPU whose Vulkan
# driver is missing), the benches refuse with "not a GPU figure" naming both, and
# gpu-check stops there with exit 1: nothing after it would be a GPU figure.
#
# Everything it prints and every report goes to OUT_DIR (default
# bench-out/gpu-check-<UTC time>): gpu-check.log, env.txt, doctor.{txt,json},
# tune.{txt,json}, throughput-webgpu.{txt,json}, status.{txt,json}, nvidia-smi-*.txt,
# memory.txt, mem-before.json, memcheck.{txt,json}, gateway.log, the generated config,
# profile-gpu.{txt,json}, collision-gpu.{txt,json,png}, lease.{txt,json}, summary.txt.
#
# Environment, respected as given: VK_DRIVER_FILES / VK_ICD_FILENAMES (the Vulkan drivers)
# and LD_LIBRARY_PATH (e.g. a Vulkan loader unpacked by hand); XDG_RUNTIME_DIR (Dawn reads
# it; a private temporary directory when unset). DEVICE (default cuda:0), TUNE_DURATION
# (default 2s per layout), BENCH_DURATION (default 3s per path and model, in 3 rounds).
# WINDOW_S (default 480). COLLISION=0, PROFILE=0 skip those steps (each then fails as not
# measured).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-${OUT:-$repo/bench-out/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}}
DEVICE=${DEVICE:-cuda:0}
TUNE_DURATION=${TUNE_DURATION:-2s}
BENCH_DURATION=${BENCH_DURATION:-3s}
WINDOW_S=${WINDOW_S:-480}
mkdir -p "$OUT" || { echo "gpu-check: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
exec 3>&1 4>&2 > >(tee -a "$OUT/gpu-check.log") 2>&1
tee_pid=$!
gw=""
# On exit: the gateway of step (c) stopped, the log flushed before the shell returns.
finish() {
	stop_gateway
	exec >&3 2>&4
	wait "$tee_pid" 2>/dev/null
}
trap finish EXIT

# The failures and the summary's rows go to files: a step in a pipeline (timed CMD | tee)
# runs in a subshell, whose variables do not come back.
failures_file=$OUT/failures.txt rows_file=$OUT/summary.rows
: >"$failures_file"
: >"$rows_file"
# stop_gateway stops step (c)'s gateway (SIGTERM drains its workers; SIGKILL after 20s).
stop_gateway() {
	[ -n "${gw:-}" ] || return 0
	kill -TERM "$gw" 2>/dev/null
	for _ in $(seq 1 200); do kill -0 "$gw" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$gw" 2>/dev/null
	wait "$gw" 2>/dev/null
	gw=""
}
fail() { echo "gpu-check: FAIL: $*"; echo "$*" >>"$failures_file"; row "${*%%:*}" "${*#*: }" FAIL; }
# row STEP WHAT VERDICT: a row of summary.txt; a failure adds its own.
row() { printf '%s|%s|%s\n' "$1" "$2" "$3" >>"$rows_file"; }
# timed STEP CMD...: CMD within what is left of the window (WINDOW_S from the start); a
# step cut short fails as such. Its time goes to the summary.
timed() {
	local name=$1 left rc t0=$SECONDS
	shift
	left=$((WINDOW_S - SECONDS))
	if [ "$left" -le 0 ]; then
		fail "$name: not run: the ${WINDOW_S}s window is spent"
		return 124
	fi
	timeout --kill-after=20 "$left" "$@"
	rc=$?
	row "$name" "time" "$((SECONDS - t0))s"
	[ "$rc" = 124 ] && fail "$name: cut short: the ${WINDOW_S}s window ran out"
	return "$rc"
}
# unmeasured_json STEP FILE: each target of the JSON report FILE without a figure
# (bin/ortbus bench unmeasured) fails STEP, named.
unmeasured_json() {
	local l
	[ -s "$2" ] || { fail "$1: not measured: no report ($2)"; return; }
	while IFS= read -r l; do fail "$l"; done < <("$repo/bin/ortbus" bench unmeasured "$1" "$2" 2>&1 | grep ': not measured: \|unmeasured:')
}
# unmeasured STEP FILE: each line of FILE saying a figure was not measured, or a target
# not judged, fails STEP, named: what was not measured did not pass.
unmeasured() {
	while IFS= read -r l; do fail "$1: not measured: ${l#note: }"; done < <(grep -iE 'not measured|targets not judged|no driver memory reading' "$2" 2>/dev/null)
}
# not_gpu STEP FILE: where FILE says its figures would not be the GPU's (the Vulkan
# adapter is another device: see the benches' checkAdapter), fail STEP naming both and
# end the check: every later step would run on that adapter too.
not_gpu() {
	local l
	l=$(grep -m 1 'not a GPU figure' "$2" 2>/dev/null) || return 0
	fail "$1: ${l}"
	echo "gpu-check: the Vulkan adapter is not the GPU: the remaining steps are not run (their figures would not be the GPU's)"
	verdict
}
die() { echo "gpu-check: $*"; exit 2; }
step() { echo; echo "== $* ($(date -u +%H:%M:%S), ${SECONDS}s in)"; }
# Figures no NVIDIA GPU can give: they need another vendor's GPU (said in the summary).
other_vendor=(
	"drm:N (AMD, Intel): a worker's device_bytes from DRM fdinfo, the device's capacity and used memory from sysfs (mem_info_vram_*), the memory check against them"
	"the adapter check on drm:N: radv's or anv's Vulkan device (not llvmpipe) for an AMD or Intel GPU"
	"the llama.cpp tenant on Vulkan on an AMD or Intel GPU, and its lease measured through DRM fdinfo"
)
# write_summary: summary.txt, one table of every row, then the figures needing another
# vendor's GPU.
write_summary() {
	{
		printf '%-12s | %-60s | %s\n' step "target or figure" verdict
		awk -F'|' '{printf "%-12s | %-60s | %s\n", $1, substr($2, 1, 200), $3}' "$rows_file"
		echo
		echo "needs another vendor's GPU (not measurable on NVIDIA):"
		printf '  - %s\n' "${other_vendor[@]}"
	} >"$OUT/summary.txt"
	cat "$OUT/summary.txt"
}
# verdict: the summary, then exit 1 naming every failure (a figure short of its target,
# or not measured), else 0.
verdict() {
	step "(e) verdict"
	write_summary
	local n
	n=$(wc -l <"$failures_file")
	if [ "$n" -gt 0 ]; then
		echo "gpu-check: $n figure(s) short of issues 31's, 32's and 41's targets or not measured:"
		sed 's/^/  - /' "$failures_file"
		echo "gpu-check: outputs in $OUT"
		exit 1
	fi
	echo "gpu-check: every target met; outputs in $OUT"
	exit 0
}

echo "gpu-check: outputs in $OUT"
echo "gpu-check: phases: tune $TUNE_DURATION measured per layout (after a warm-up of up to 1s); bench throughput $BENCH_DURATION measured per path and model (3 rounds), each path's first run and warm-up unmeasured"

# --- preflight: an NVIDIA GPU, the build, the runtime, the Vulkan loader -------------------
command -v nvidia-smi >/dev/null || die "no NVIDIA GPU: nvidia-smi not found"
gpus=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1) ||
	die "no NVIDIA GPU: nvidia-smi failed: $gpus"
[ -n "$gpus" ] || die "no NVIDIA GPU: nvidia-smi lists none"
echo "gpu-check: GPUs (index, name, memory, driver): $gpus"
for b in ortbus gateway ortworker; do
	[ -x "$repo/bin/$b" ] || die "$repo/bin/$b is missing: run make build"
done
lib=$repo/.deps/ort-1.30.0/lib/libonnxruntime.so.1
[ -f "$lib" ] || die "ONNX Runtime 1.30.0 is not at $lib: run make prepare"

loader=""
IFS=: read -r -a ldirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${ldirs[@]}"; do
	[ -n "$d" ] && [ -e "$d/libvulkan.so.1" ] && { loader="$d/libvulkan.so.1 (LD_LIBRARY_PATH)"; break; }
done
if [ -z "$loader" ]; then
	loader=$(ldconfig -p 2>/dev/null | awk '/libvulkan\.so\.1 /{print $NF; exit}')
fi
[ -n "$loader" ] || die "no Vulkan loader (libvulkan.so.1) in LD_LIBRARY_PATH or ldconfig's cache: install libvulkan1, or unpack it and point LD_LIBRARY_PATH at it"
if [ -n "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ]; then
	icds="VK_DRIVER_FILES=${VK_DRIVER_FILES:-} VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-} (as given)"
else
	icds=$(ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json /usr/local/share/vulkan/icd.d/*.json 2>/dev/null | tr '\n' ' ')
	case "$icds" in *nvidia*) ;; *) echo "gpu-check: warning: no nvidia_icd.json among the Vulkan drivers ($icds): Dawn may not see the GPU (the NVIDIA driver's graphics libraries are needed, e.g. NVIDIA_DRIVER_CAPABILITIES=graphics in a container)" ;; esac
fi
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
	XDG_RUNTIME_DIR=$(mktemp -d) && chmod 700 "$XDG_RUNTIME_DIR" && export XDG_RUNTIME_DIR
fi
{
	echo "date: $(date -u +%FT%TZ)"; echo "host: $(cat /proc/sys/kernel/hostname) $(uname -r), $(nproc) cores"
	echo "gpus: $gpus"; echo "vulkan loader: $loader"; echo "vulkan drivers: $icds"
	echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; echo "XDG_RUNTIME_DIR=$XDG_RUNTIME_DIR"
	echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee "$OUT/env.txt"

# --- the model and the config ---------------------------------------------------------------
work=$OUT/work
mkdir -p "$work/spool"
if [ -f "$repo/.deps/ocr/ppocrv4-det/model.onnx" ]; then
	model_dir=$repo/.deps/ocr/ppocrv4-det input="x=zeros:1x3x640x640"
	echo "gpu-check: model: PP-OCRv4 det (.deps/ocr/ppocrv4-det), input [1,3,640,640]"
else
	"$repo/bin/ortbus" models gen "$work/models" -heavy 10 || die "ortbus models gen failed"
	model_dir=$work/models/tagger-heavy input="input=zeros:1x3x448x448"
	echo "gpu-check: model: the generated tagger-heavy (10 layers) as a raw model, input [1,3,448,448] (no .deps/ocr/ppocrv4-det: make ocr-model for the detector)"
fi
# write_config FILE WORKERS MAX_BATCH
write_config() {
	cat >"$1" <<EOF
# generated by scripts/gpu-check.sh
[nats]
embedded = true

[security]
allowed_roots = ["$work"]
spool_dir = "$work/spool"

[models.det]
kind = "raw"
dir = "$model_dir"

[pools.gpu]
runtime = "$lib"
ep = "webgpu"
device = "$DEVICE"
workers = $2
threads = 1
max_batch = $3
classes = ["interactive", "batch"]
models = ["det"]
EOF
}
cfg=$OUT/webgpu.toml
write_config "$cfg" 1 0

# --- (a) doctor -----------------------------------------------------------------------------
step "(a) bin/ortbus doctor -config $cfg"
timed doctor "$repo/bin/ortbus" doctor -config "$cfg" | tee "$OUT/doctor.txt"
if [ "${PIPESTATUS[0]}" = 0 ]; then
	row doctor "pool gpu: webgpu on $DEVICE, adapter $(sed -n 's/^ *webgpu *adapter //p' "$OUT/doctor.txt" | head -n 1 | cut -c1-60)" ok
else
	fail "doctor: pool gpu (webgpu on $DEVICE) is not usable (doctor.txt)"
	# Seen in a container: the loader's "Could not get 'vkCreateInstance' via
	# 'vk_icdGetInstanceProcAddr' for ICD libGLX_nvidia.so.0" (VK_LOADER_DEBUG=error,driver).
	echo "gpu-check: hint: NVIDIA's Vulkan driver (libGLX_nvidia.so.0) also needs the GL dispatch libraries (libglvnd0, libegl1, libglx0, libgl1, libopengl0, libgles2) and, in a container, VK_DRIVER_FILES naming its nvidia_icd.json (e.g. /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json); VK_LOADER_DEBUG=error,driver shows why a driver is refused"
fi
"$repo/bin/ortbus" doctor -config "$cfg" -json >"$OUT/doctor.json" 2>&1

# --- (b) tune, then the throughput bench with its layout -------------------------------------
step "(b) bin/ortbus tune -config $cfg -ep webgpu -device $DEVICE -input $input -duration $TUNE_DURATION -json $OUT/tune.json gpu"
timed tune "$repo/bin/ortbus" tune -config "$cfg" -ep webgpu -device "$DEVICE" -input "$input" -duration "$TUNE_DURATION" -json "$OUT/tune.json" gpu 2>&1 | tee "$OUT/tune.txt"
[ "${PIPESTATUS[0]}" = 0 ] || fail "tune: tune -ep webgpu failed (tune.txt)"
not_gpu tune "$OUT/tune.txt"
# Each layout's workers' device_bytes against the GPU's own growth (issue 41, item 2).
grep -q '^memory check' "$OUT/tune.txt" || fail "tune: not measured: no layout's memory check (the workers' device_bytes against the GPU's growth)"
while IFS= read -r l; do fail "tune: $l"; done < <(grep '^memory check' "$OUT/tune.txt" | grep -v ': ok$')
workers=1 max_batch=0
if w=$(sed -n 's/^winner: \([0-9]*\)×\([0-9]*\) spin=[a-z]* batch=\([0-9]*\).*/\1 \3/p' "$OUT/tune.txt") && [ -n "$w" ]; then
	read -r workers max_batch <<<"$w"
	echo "gpu-check: tune picked $workers worker(s), max_batch $max_batch"
	row tune "the layout tune picked" "$workers worker(s), max_batch $max_batch"
else
	fail "tune: printed no winner: the bench runs 1 worker per pool"
fi

step "(b) bin/ortbus bench throughput -ep webgpu -device $DEVICE -workers $workers -threads 1 -duration $BENCH_DURATION -out $OUT/throughput-webgpu.json"
timed throughput "$repo/bin/ortbus" bench throughput -ep webgpu -device "$DEVICE" -workers "$workers" -threads 1 -duration "$BENCH_DURATION" \
	-out "$OUT/throughput-webgpu.json" 2>&1 | tee "$OUT/throughput-webgpu.txt"
if [ "${PIPESTATUS[0]}" != 0 ]; then
	fail "throughput: bench throughput -ep webgpu failed (throughput-webgpu.txt)"
	not_gpu throughput "$OUT/throughput-webgpu.txt"
else
	grep -q '^SMOKE' "$OUT/throughput-webgpu.txt" && fail "throughput: ran its smoke, not the GPU figures (see its GPU check)"
	unmeasured throughput "$OUT/throughput-webgpu.txt"
	unmeasured_json throughput "$OUT/throughput-webgpu.json"
	grep -q '^node: SKIPPED' "$OUT/throughput-webgpu.txt" && fail "throughput: no onnxruntime-node figures (make node-bench): the system vs node target is not measured"
	while IFS= read -r n; do fail "throughput: ${n#note: }"; done < <(grep '^note: target missed' "$OUT/throughput-webgpu.txt")
	while IFS= read -r n; do row throughput "${n%%:*}: the system against in-process and node webgpu" "${n#*: }"; done < <(grep '>= 1.0x in-process webgpu' "$OUT/throughput-webgpu.txt")
fi

# --- (c) each worker's device memory: ortbus status beside nvidia-smi ------------------------
step "(c) bin/gateway on the config with $workers worker(s); bin/ortbus status -json beside nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
mcfg=$OUT/webgpu-memory.toml
write_config "$mcfg" "$workers" "$max_batch"
t_mem=$SECONDS
# The GPU's memory before any worker: the independent check's baseline.
"$repo/bin/ortbus" bench memcheck -device "$DEVICE" -save "$OUT/mem-before.json" ||
	fail "memory: not measured: no reading of $DEVICE before the workers (bin/ortbus bench memcheck -save)"
"$repo/bin/gateway" -config "$mcfg" -nats-listen 127.0.0.1:0 -http-listen - -worker "$repo/bin/ortworker" >"$OUT/gateway.log" 2>&1 &
gw=$!
url=""
for _ in $(seq 1 900); do
	url=$(sed -n 's/.*"event":"ready".*"nats_url":"\([^"]*\)".*/\1/p' "$OUT/gateway.log" | head -n 1)
	[ -n "$url" ] && break
	kill -0 "$gw" 2>/dev/null || break
	sleep 0.1
done
# status_workers FILE: one line per worker of status JSON (ortbus status -json, indented by
# two spaces a level): worker pool pid state ep device_bytes device_source, then a line per
# model: "model" worker name peak_bytes peak_source.
status_workers() {
	awk '
	/^  "workers": \[$/ { inw = 1; next }
	inw && /^  \]/ { inw = 0 }
	!inw { next }
	/^    \{/ { w = ""; p = ""; pid = ""; st = ""; ep = ""; db = "-"; ds = "-"; nm = 0; next }
	/^      "worker": / { w = $2; gsub(/[",]/, "", w) }
	/^      "pool": / { p = $2; gsub(/[",]/, "", p) }
	/^      "pid": / { pid = $2; gsub(/,/, "", pid) }
	/^      "state": / { st = $2; gsub(/[",]/, "", st) }
	/^      "ep": / { ep = $2; gsub(/[",]/, "", ep) }
	/^      "device_bytes": / { db = $2; gsub(/,/, "", db) }
	/^      "device_source": / { ds = $2; gsub(/[",]/, "", ds) }
	/^          "name": / { nm++; mn[nm] = $2; gsub(/[",]/, "", mn[nm]); mp[nm] = "-"; ms[nm] = "-" }
	/^          "peak_bytes": / { mp[nm] = $2; gsub(/,/, "", mp[nm]) }
	/^          "peak_source": / { ms[nm] = $2; gsub(/[",]/, "", ms[nm]) }
	/^    \}/ { print w, p, pid, st, ep, db, ds; for (i = 1; i <= nm; i++) print "model", w, mn[i], mp[i], ms[i] }
	' "$1"
}
if [ -z "$url" ]; then
	fail "memory: the gateway on $mcfg never printed its ready line (gateway.log)"
	tail -n 20 "$OUT/gateway.log"
else
	echo "gpu-check: gateway ready on $url"
	# The workers load the model and warm it up (shader compilation): up to 2 minutes for
	# them to be ready, then up to 5 s more for each to report its device memory.
	ready=0 measured=0
	for i in $(seq 1 600); do
		if "$repo/bin/ortbus" status -s "$url" -json >"$OUT/status.json" 2>/dev/null; then
			ready=$(status_workers "$OUT/status.json" | awk '$1 != "model" && $2 == "gpu" && $4 == "ready" {n++} END {print n + 0}')
			measured=$(status_workers "$OUT/status.json" | awk '$1 != "model" && $2 == "gpu" && $4 == "ready" && $6 != "-" {n++} END {print n + 0}')
		fi
		[ "$measured" -ge "$workers" ] && break
		# A pool or worker error (provider_unavailable, a crash loop): no use waiting.
		grep -q '^      "error": {' "$OUT/status.json" 2>/dev/null && [ "$i" -ge 10 ] && break
		[ "$ready" -ge "$workers" ] && [ -z "${ready_at:-}" ] && ready_at=$i
		[ -n "${ready_at:-}" ] && [ $((i - ready_at)) -ge 25 ] && break
		sleep 0.2
	done
	echo "gpu-check: $ready of $workers worker(s) ready, $measured reporting device_bytes"
	sleep 1 # a heartbeat interval past the last load: the samples settle
	"$repo/bin/ortbus" status -s "$url" -json >"$OUT/status.json"
	"$repo/bin/ortbus" status -s "$url" | tee "$OUT/status.txt"
	nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits >"$OUT/nvidia-smi-compute-apps.txt" 2>&1
	nvidia-smi -q -d PIDS >"$OUT/nvidia-smi-pids.txt" 2>&1
	nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
	echo "gpu-check: nvidia-smi --query-compute-apps=pid,used_memory (MiB):"
	sed 's/^/  /' "$OUT/nvidia-smi-compute-apps.txt"
	status_workers "$OUT/status.json" >"$OUT/status-workers.txt"
	rm -f "$OUT/memory-failures.txt"
	{
		printf '%-12s %-6s %-8s %-8s %-16s %-16s %-22s %s\n' worker pool pid ep "status MiB" "nvidia-smi MiB" "nvidia-smi source" verdict
		n=0
		while read -r w p pid st ep db ds; do
			[ "$w" = model ] && continue
			[ "$p" = gpu ] || continue
			n=$((n + 1))
			smi=$(awk -F', *' -v pid="$pid" '$1 == pid {print $2; exit}' "$OUT/nvidia-smi-compute-apps.txt") src="compute-apps"
			if [ -z "$smi" ]; then # a Vulkan process may be listed as a graphics one only
				smi=$(awk -v pid="$pid" '/Process ID/ {cur = $NF} /Used GPU Memory/ && cur == pid {print $(NF-1); exit}' "$OUT/nvidia-smi-pids.txt") src="-q -d PIDS"
			fi
			mib=$([ "$db" = - ] && echo - || awk -v b="$db" 'BEGIN {printf "%.1f", b / 1048576}')
			verdict=ok
			# device_bytes is nvidia-smi's per-process figure: shown beside it for reading,
			# never judged by it (the check is bench memcheck's, against memory.used).
			if [ "$ep" != webgpu ]; then
				verdict="FAIL: ep $ep"
			elif [ "$db" = - ]; then
				verdict="FAIL: no device_bytes in ortbus status"
			elif [ -z "$smi" ]; then
				src=-
			fi
			printf '%-12s %-6s %-8s %-8s %-16s %-16s %-22s %s\n' "$w" "$p" "$pid" "$ep" "$mib ($ds)" "${smi:--}" "$src" "$verdict"
			[ "$verdict" = ok ] || echo "worker $w (pid $pid): ${verdict#FAIL: } (status ${mib} MiB, nvidia-smi ${smi:--} MiB)" >>"$OUT/memory-failures.txt"
		done <"$OUT/status-workers.txt"
		[ "$n" -gt 0 ] || echo "no worker of pool gpu in ortbus status"
		echo
		printf '%-12s %-10s %-16s %s\n' worker model "peak MiB" peak_source
		awk '$1 == "model" {printf "%-12s %-10s %-16s %s\n", $2, $3, ($4 == "-" ? "-" : sprintf("%.1f", $4 / 1048576)), $5}' "$OUT/status-workers.txt"
	} | tee "$OUT/memory.txt"
	while IFS= read -r l; do fail "memory: $l"; done < <(cat "$OUT/memory-failures.txt" 2>/dev/null)
	grep -q '^no worker of pool gpu' "$OUT/memory.txt" && fail "memory: no worker of pool gpu in ortbus status"
	while read -r _ w m _ src; do
		[ "$src" = device ] || fail "memory: model $m of worker $w: peak_source $src, want device (measured on the GPU)"
	done < <(awk '$1 == "model"' "$OUT/status-workers.txt")
	# The independent check: the workers' device_bytes against the GPU's own growth.
	if [ -s "$OUT/mem-before.json" ]; then
		"$repo/bin/ortbus" bench memcheck -device "$DEVICE" -before "$OUT/mem-before.json" -status "$OUT/status.json" -out "$OUT/memcheck.json" 2>&1 | tee "$OUT/memcheck.txt"
		mrc=${PIPESTATUS[0]}
		mc=$(sed -n 's/.*: the workers put .*off [0-9.]*%: //p' "$OUT/memcheck.txt")
		if [ "$mrc" = 0 ] && [ "$mc" = ok ]; then
			row memory "the workers' device_bytes against memory.used's growth (other processes subtracted)" "ok ($(sed -n 's/.*\(off [0-9.]*%\).*/\1/p' "$OUT/memcheck.txt"))"
		else
			fail "memory: the workers' device_bytes against memory.used's growth: $(tail -n 1 "$OUT/memcheck.txt")"
		fi
	fi
fi
stop_gateway
row memory time "$((SECONDS - t_mem))s"

# --- (d0) issue 41's profile: each service of the GPU scenario alone ---------------------------
if [ "${PROFILE:-1}" != 0 ]; then
	step "(d0) bin/ortbus bench profile -scenario gpu -out $OUT/profile-gpu.json"
	timed profile "$repo/bin/ortbus" bench profile -scenario gpu -out "$OUT/profile-gpu.json" >"$OUT/profile-gpu.txt" 2>&1 ||
		fail "profile: bench profile -scenario gpu failed (profile-gpu.txt)"
	cat "$OUT/profile-gpu.txt"
	not_gpu profile "$OUT/profile-gpu.txt"
	unmeasured profile "$OUT/profile-gpu.txt"
	unmeasured_json profile "$OUT/profile-gpu.json"
	while IFS= read -r l; do fail "profile: not measured: $l"; done < <(grep -E '^[a-z_]+: .*no power reading' "$OUT/profile-gpu.txt")
else
	fail "profile: not measured (PROFILE=0): each service's p95, items/s, CPU %, idle and peak memory, power"
fi

# --- (d) issue 32's collision on the GPU ------------------------------------------------------
if [ "${COLLISION:-1}" != 0 ]; then
	step "(d) bin/ortbus bench collision -scenario gpu -out $OUT/collision-gpu.json -chart $OUT/collision-gpu.png"
	if ! timed collision "$repo/bin/ortbus" bench collision -scenario gpu -out "$OUT/collision-gpu.json" -chart "$OUT/collision-gpu.png" >"$OUT/collision-gpu.txt" 2>&1; then
		fail "collision: bench collision -scenario gpu failed (collision-gpu.txt)"
	fi
	cat "$OUT/collision-gpu.txt"
	not_gpu collision "$OUT/collision-gpu.txt"
	unmeasured collision "$OUT/collision-gpu.txt"
	unmeasured_json collision "$OUT/collision-gpu.json"
	while IFS= read -r n; do fail "collision: ${n#note: target missed: }"; done < <(grep '^note: target missed' "$OUT/collision-gpu.txt")
else
	fail "collision: not measured (COLLISION=0): urgent p95 <= 1.5x solo, 0 frames dropped, the GPU's peak within its budget, 0 requests lost"
fi

# --- (f) the lease: a holder's memory free -> the waiting acquire granted ----------------------
# lease_run NAME WHAT FLAGS...: one run of bench lease; its p50 in the summary, its missed
# targets and any other note (a smoke on lavapipe, an adapter that is not the GPU) failures.
lease_run() {
	local name=$1 what=$2
	shift 2
	step "(f) bin/ortbus bench lease -n 3 $* -out $OUT/$name.json"
	if timed "$name" "$repo/bin/ortbus" bench lease -n 3 "$@" -out "$OUT/$name.json" >"$OUT/$name.txt" 2>&1; then
		cat "$OUT/$name.txt"
		row "$name" "free -> grant on $what, p50" "$(sed -n 's/.*"free_end_to_grant_p50_ms": \([0-9.]*\).*/\1 ms/p' "$OUT/$name.json" | head -n 1)"
		while IFS= read -r n; do fail "$name: ${n#note: }"; done < <(grep '^note: ' "$OUT/$name.txt")
	else
		cat "$OUT/$name.txt"
		fail "$name: bench lease failed ($name.txt)"
	fi
}
lease_run lease-gpu "the GPU's memory ($DEVICE, a WebGPU holder)" -ep webgpu -device "$DEVICE"
lease_run lease "the host's memory (cpu)"

# --- (e) the verdict ------------------------------------------------------------------------
verdict
