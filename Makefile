# tp-toolkit build. `make` builds everything into build/bin; `make check`
# runs the quick tier of tests, `make test` every test; `make demo` runs the
# main job end to end. Each installs missing Debian packages first
# (`make deps`).

BUILD ?= build
CC ?= cc
PYTHON := /usr/bin/python3

# CUDA: on when nvcc is found (PATH or /usr/local/cuda/bin); `make CUDA=0` turns it off.
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
ifeq ($(NVCC),)
CUDA ?= 0
else
CUDA ?= 1
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# Machine code for the A100 (sm_80) and the H100/H200 (sm_90), and PTX that
# the driver compiles for later GPUs.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90

# Third-party headers come in as system headers so their warnings stay theirs.
PKGS := hdf5 libzstd libcjson libxxhash openblas ompi-c libcrypto libcurl libisal
PKG_CFLAGS := $(patsubst -I%,-isystem %,$(shell pkg-config --cflags $(PKGS) 2>/dev/null))
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# A quiet build: one line per step (`CC ckpt/reader.c`); `make V=1` prints
# the full commands instead.
V ?= 0
ifeq ($(V),1)
Q :=
say = @true
else
Q := @
say = @printf '  %-5s %s\n'
endif

# The builds the other targets run (`make test`, `make demo`...) use every
# core unless make was given -j itself (its job server then serves them).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
SUBMAKE = $(MAKE) --no-print-directory $(if $(findstring -j,$(MAKEFLAGS)),,-j$(JOBS))

# OPTFLAGS and SANITIZE select the build flavour; CFLAGS/LDFLAGS add to them.
OPTFLAGS ?= -O2 -g
SANITIZE ?=
ALL_CFLAGS = $(OPTFLAGS) -std=c11 -Wall -Wextra -Wpointer-arith -Werror -D_GNU_SOURCE -pthread -MMD -MP $(PKG_CFLAGS) \
	$(SANITIZE) $(CFLAGS)
# A run path relative to each binary (bin/ and tests/DIR/ beside lib/), as
# DT_RPATH so that it also serves the libraries' own dependencies: the GPU
# pack (scripts/gpu-pack.sh) puts the shared libraries there. In this tree
# that lib/ holds no shared library, and the system's are found as usual.
ORIGIN_RPATH := -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/../lib:$$ORIGIN/../../lib'
ALL_LDFLAGS = -pthread $(ORIGIN_RPATH) $(SANITIZE) $(LDFLAGS)
# The sanitized build's programs and tests keep every library they load until
# exit (tests/sanitizer/keep_libraries.c: LeakSanitizer then names the Open MPI
# component a leak at exit comes from without unwinding every allocation fully).
ifneq ($(SANITIZE),)
KEEP_LIBRARIES := $(BUILD)/obj/tests/sanitizer/keep_libraries.o
ALL_LDFLAGS += -Wl,--export-dynamic-symbol=dlclose
endif
# oneDNN (no pkg-config file in Debian) for the CPU's bf16 products, on its OpenMP runtime.
LDLIBS += $(PKG_LIBS) -ldnnl -lgomp -lm
NVCCFLAGS ?= -O2 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror

# The libraries, lowest first (README.md "Layout of the source"): each uses
# only those before it; the programs sit on top. scripts/check-layers.py
# declares the order and checks the include graph against it (make test).
COMMON_SRC := $(wildcard common/*.c)
# The search for the CUDA libraries is plain C, built and tested without CUDA too.
KERNELS_SRC := $(wildcard kernels/cpu/*.c) kernels/timed.c kernels/cuda/libraries.c
STORE_SRC := $(wildcard store/*.c)
CKPT_SRC := $(wildcard ckpt/*.c)
RESHARD_SRC := $(wildcard reshard/*.c)
FORMATS_SRC := $(wildcard formats/*.c)
MODEL_SRC := $(wildcard model/*.c)
# The trainer's MPI communicator is a library of its own: the trainer itself
# (and anything driving it in one process) needs no MPI.
TRAINER_SRC := $(filter-out trainer/comm_mpi.c,$(wildcard trainer/*.c))
COMM_MPI_SRC := trainer/comm_mpi.c
ELASTIC_SRC := $(wildcard elastic/*.c)
ifeq ($(CUDA),1)
KERNELS_CU := $(wildcard kernels/cuda/*.cu)
# cuBLAS (the CUDA kernel backend's matrix products) is loaded with dlopen
# when the backend is created (kernels/cuda/backend.cu), not linked: linked,
# it cost every program 0.6 s and 200 MB at start. The run path lets dlopen
# find the toolkit's copy where ld.so would not.
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
else
KERNELS_SRC += kernels/cuda/none.c
KERNELS_CU :=
CUDA_LIBS :=
endif

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
LIB_COMMON := $(BUILD)/lib/libtpcommon.a
LIB_KERNELS := $(BUILD)/lib/libtpkernels.a
LIB_STORE := $(BUILD)/lib/libtpstore.a
LIB_CKPT := $(BUILD)/lib/libtpckpt.a
LIB_RESHARD := $(BUILD)/lib/libtpreshard.a
LIB_FORMATS := $(BUILD)/lib/libtpformats.a
LIB_MODEL := $(BUILD)/lib/libtpmodel.a
LIB_TRAINER := $(BUILD)/lib/libtptrainer.a
LIB_COMM_MPI := $(BUILD)/lib/libtpcomm_mpi.a
LIB_ELASTIC := $(BUILD)/lib/libtpelastic.a

# What each program links, top of the stack first.
CKPT_STACK := $(LIB_CKPT) $(LIB_STORE) $(LIB_KERNELS) $(LIB_COMMON)
RESHARD_STACK := $(LIB_RESHARD) $(CKPT_STACK)
# formats/ writes Megatron checkpoints through reshard/ (pieces at a layout).
MODEL_STACK := $(LIB_MODEL) $(LIB_FORMATS) $(RESHARD_STACK)
TRAINER_STACK := $(LIB_TRAINER) $(LIB_MODEL) $(LIB_FORMATS) $(RESHARD_STACK)
# The orchestrator runs the trainer as a program: of the trainer's library it
# links only the pipeline schedule (pure functions: the planner's memory and
# bubble) and tp-elastic run the reading of a run's model from its checkpoints
# (checkpoint_run_model, the trainer's resume's), which the static library's
# lookup alone pulls in.
ELASTIC_STACK := $(LIB_ELASTIC) $(LIB_TRAINER) $(LIB_MODEL) $(LIB_FORMATS) $(RESHARD_STACK)
# Command-line helpers the programs share (not a library: they print and exit).
CLI_OBJ := $(call obj,programs/cli.c programs/progress.c)
SYNTH_OBJ := $(call obj,programs/synth.c)

PROGRAMS := $(BUILD)/bin/tp-ckpt $(BUILD)/bin/tp-reshard $(BUILD)/bin/tp-train $(BUILD)/bin/tp-elastic
BENCH_PROGRAMS := $(BUILD)/bench/bench_ckpt $(BUILD)/bench/product_peak $(BUILD)/bench/index_scale
TEST_SRC := $(wildcard tests/*/test_*.c)
TEST_SUPPORT := $(call obj,$(wildcard tests/support/*.c))
# tests/tools: programs the test scripts run (tests/tools/pyfork.c: their python3).
TEST_TOOLS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/tools/*.c))
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC)) $(BUILD)/tests/trainer/layer_check $(TEST_TOOLS)
# Tests link the whole stack, MPI communicator included.
TEST_LIBS := $(LIB_ELASTIC) $(LIB_COMM_MPI) $(TRAINER_STACK)

$(PROGRAMS) $(BENCH_PROGRAMS) $(TEST_BINS): $(KEEP_LIBRARIES)

# Keep objects of tests between builds.
.SECONDARY:

.PHONY: all build deps check test test-gpu bench-gpu gpu-pack asan soak fuzz demo bench-ckpt bench-reshard bench-train bench-export bench-megatron bench-dcp bench-dcp-strided bench-llama bench-elastic bench-remote bench-scale bench-parallel bench-revisions clean programs tests

# The targets below whose recipes run a build of their own (SUBMAKE). Asked
# for beside other goals (`make -j2 all tests`), this make and that build
# would write the same files at once: such a command line runs its goals one
# after the other (each build still uses every job).
WRAPPER_GOALS := all check test asan test-gpu bench-gpu gpu-pack soak fuzz demo $(filter bench-%,$(MAKECMDGOALS))
ifeq ($(MAKELEVEL),0)
ifneq ($(filter $(WRAPPER_GOALS),$(MAKECMDGOALS)),)
ifneq ($(word 2,$(MAKECMDGOALS)),)
.NOTPARALLEL:
endif
endif
endif

all: deps
	+@$(SUBMAKE) build

build: programs tests $(BENCH_PROGRAMS) $(BUILD)/bin/tp-mpirun

programs: $(PROGRAMS)
tests: $(TEST_BINS)

deps:
	@scripts/deps.sh

# The build configuration: when it changes (CUDA=0 after a CUDA build, other
# flags), every object is rebuilt, so no build mixes two configurations.
BUILD_CONFIG := CUDA=$(CUDA) CC=$(CC) NVCC=$(NVCC) CFLAGS=$(ALL_CFLAGS) NVCCFLAGS=$(NVCCFLAGS) LDFLAGS=$(ALL_LDFLAGS)
$(BUILD)/config: FORCE
	@mkdir -p $(dir $@)
	@echo '$(BUILD_CONFIG)' | cmp -s - $@ || echo '$(BUILD_CONFIG)' >$@
.PHONY: FORCE
FORCE:

# Kernels: loops over elements vectorize (floating-point exceptions are not used,
# nor errno from sqrtf, whose check kept AdamW's loop scalar; clang, for `make fuzz`,
# has no cost-model option).
$(BUILD)/obj/kernels/%.o: ALL_CFLAGS += -ftree-vectorize $(if $(findstring clang,$(CC)),,-fvect-cost-model=dynamic) -fno-trapping-math -fno-math-errno

$(BUILD)/obj/kernels/cuda/libraries.o: ALL_CFLAGS += $(if $(CUDA_HOME),-DTP_CUDA_HOME='"$(CUDA_HOME)"')

$(BUILD)/obj/%.o: %.c $(BUILD)/config
	@mkdir -p $(dir $@)
	$(say) CC $<
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu kernels/convert_bits.h kernels/kernels.h $(wildcard kernels/cuda/*.h) $(BUILD)/config
	@mkdir -p $(dir $@)
	$(say) NVCC $<
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIB_COMMON): $(call obj,$(COMMON_SRC))
$(LIB_KERNELS): $(call obj,$(KERNELS_SRC)) $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(KERNELS_CU))
$(LIB_STORE): $(call obj,$(STORE_SRC))
$(LIB_CKPT): $(call obj,$(CKPT_SRC))
$(LIB_RESHARD): $(call obj,$(RESHARD_SRC))
$(LIB_FORMATS): $(call obj,$(FORMATS_SRC))
$(LIB_MODEL): $(call obj,$(MODEL_SRC))
$(LIB_TRAINER): $(call obj,$(TRAINER_SRC))
$(LIB_COMM_MPI): $(call obj,$(COMM_MPI_SRC))
$(LIB_ELASTIC): $(call obj,$(ELASTIC_SRC))
$(BUILD)/lib/%.a:
	@mkdir -p $(dir $@)
	$(say) AR $@
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/bin/tp-ckpt: $(call obj,programs/tp-ckpt.c) $(CLI_OBJ) $(SYNTH_OBJ) $(MODEL_STACK)
# tp-reshard reads and writes other tools' checkpoints through formats/ (and
# this model's as Megatron-LM's through model/).
$(BUILD)/bin/tp-reshard: $(call obj,programs/tp-reshard.c) $(CLI_OBJ) $(MODEL_STACK)
$(BUILD)/bin/tp-train: $(call obj,programs/tp-train.c) $(CLI_OBJ) $(LIB_COMM_MPI) $(TRAINER_STACK)
$(BUILD)/bin/tp-elastic: $(call obj,programs/tp-elastic.c $(wildcard programs/elastic_*.c)) $(CLI_OBJ) $(ELASTIC_STACK)
$(BUILD)/bin/%:
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# Open MPI's mpirun from inside a GPU pack (scripts/gpu-pack.sh): glibc only.
$(BUILD)/bin/tp-mpirun: $(call obj,programs/tp-mpirun.c)
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^

$(BUILD)/bench/bench_ckpt: $(BUILD)/obj/bench/bench_ckpt.o $(CLI_OBJ) $(SYNTH_OBJ) $(MODEL_STACK)
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/bench/product_peak: $(BUILD)/obj/bench/product_peak.o $(LIB_KERNELS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LDLIBS)

# index_scale counts the heap through wrappers of the allocator (bench/index_scale.c).
$(BUILD)/bench/index_scale: $(BUILD)/obj/bench/index_scale.o $(MODEL_STACK)
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# An MPI program the layer tests run under mpirun: without Criterion, whose
# sandbox would take it for one of its own children.
$(BUILD)/tests/trainer/layer_check: $(BUILD)/obj/tests/trainer/layer_check.o $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# A test tool needs nothing but the C library.
$(TEST_TOOLS): $(BUILD)/tests/tools/%: $(BUILD)/obj/tests/tools/%.o
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_SUPPORT) $(TEST_LIBS)
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS) -lcriterion

# Two tiers (scripts/run-tests.py): `make check`, the edit loop (every unit
# test and one end-to-end scenario per program, under 2 minutes on 2 cores),
# and `make test`, everything (what CI runs). TEST_JOBS tests run at once.
TEST_JOBS ?= 3
check: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/run-tests.py --tier check --jobs $(TEST_JOBS)

test: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/run-tests.py --tier full --jobs $(TEST_JOBS)

# The same suite under AddressSanitizer and UndefinedBehaviorSanitizer.
asan: deps
	+@$(SUBMAKE) BUILD=build-asan CUDA=0 OPTFLAGS="-O1 -g -fno-omit-frame-pointer" \
		SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=all" build
	@BUILD=build-asan SANITIZED=1 scripts/run-tests.py --tier full --jobs $(TEST_JOBS)

# The GPU tests on a machine with a GPU and nvcc: the unit tests (none of
# the CUDA ones may skip) and tests/gpu/test_gpu.sh (tp-train --device cuda
# against PyTorch, the CPU, other layouts, checkpoints both ways). Fails
# without a GPU instead of skipping.
test-gpu: deps
	+@$(SUBMAKE) CUDA=1 build
	@BUILD=$(BUILD) GPU_REQUIRED=1 sh tests/gpu/test_gpu.sh

bench-gpu: deps
	+@$(SUBMAKE) CUDA=1 build
	@BUILD=$(BUILD) scripts/bench-gpu.sh

# The GPU pack (docs/GPU.md): $(BUILD)/gpu-pack.tar.xz, the CUDA build with
# every library it loads and an Open MPI runtime, for a bare GPU machine
# (scripts/gpu-check.sh runs it there).
gpu-pack: deps
	+@$(SUBMAKE) CUDA=1 build
	@BUILD=$(BUILD) scripts/gpu-pack.sh

# A longer soak of tp-elastic than `make test` runs (6 faults, seed 7):
# SOAK_FAULTS random kills, hangs, launcher losses and capacity changes in
# one run, a new seed each time (printed, with the command that replays it).
SOAK_FAULTS ?= 30
soak: deps
	+@$(SUBMAKE) build
	@SOAK_FAULTS=$(SOAK_FAULTS) SOAK_SEED=$${SOAK_SEED:-$$(date +%s)} BUILD=$(BUILD) sh tests/elastic/test_soak.sh

# Fuzzing with libFuzzer (clang) under ASan and UBSan: the index parser, the
# safetensors reader, the partition arithmetic, the pickle interpreter,
# torch.save archives, Megatron-LM checkpoints, the Megatron-LM writer's
# carrying over of a source's non-tensor state, PyTorch distributed
# checkpoints' .metadata, Megatron-Core's .metadata and common.pt, its
# metadata.json and tracker file, Hugging Face config.json and tokenizer
# files, and tp-train's token files (tests/fuzz/fuzz_*.c), each
# for FUZZ_SECONDS from its seed corpus (tests/fuzz/corpus/<target>, with
# tests/fuzz/<target>.dict where there is one, and the corpora that
# tests/fuzz/<target>.seeds names, a folder a line); new
# inputs go to build-fuzz/corpus, crashes to build-fuzz/crashes. `make test`
# replays the corpus (tests/ckpt/test_hostile.c) and builds and runs every
# fuzzer for a second (tests/e2e/test_fuzz_build.sh), so that none rots.
# The fuzzers of files write each input under TMPDIR: one on tmpfs
# (TMPDIR=/dev/shm make fuzz) ran fuzz_data 10 times as many inputs a
# second as /tmp on a shared disk (docs/RELIABILITY.md).
FUZZ_SECONDS ?= 30
# Where the fuzzers are built and their corpora and crashes kept
# (tests/e2e/test_fuzz_build.sh builds them in its own directory).
FUZZ_BUILD ?= build-fuzz
FUZZ_TARGETS := index safetensors partition pickle torch megatron megatron_write dcp megatron_dist megatron_dist_json hf data
FUZZ_SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all
fuzz: deps
	@command -v clang >/dev/null || { echo "make fuzz needs clang (apt-get install clang)" >&2; exit 1; }
	+@$(SUBMAKE) BUILD=$(FUZZ_BUILD) CC=clang CUDA=0 OPTFLAGS="-O1 -g -fno-omit-frame-pointer" \
		CFLAGS="-Wno-error" SANITIZE="$(FUZZ_SANITIZE) -fsanitize=fuzzer-no-link" $(patsubst %,$(FUZZ_BUILD)/fuzz/fuzz_%,$(FUZZ_TARGETS))
	@mkdir -p $(FUZZ_BUILD)/crashes; for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_BUILD)/corpus/$$t; echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
		$(FUZZ_BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=3072 -print_final_stats=1 \
			$$(test -f tests/fuzz/$$t.dict && echo -dict=tests/fuzz/$$t.dict) -artifact_prefix=$(FUZZ_BUILD)/crashes/$$t- $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t \
			$$(test -f tests/fuzz/$$t.seeds && cat tests/fuzz/$$t.seeds) >$(FUZZ_BUILD)/fuzz_$$t.log 2>&1; \
		rc=$$?; grep -E 'DONE|number_of_executed_units|ERROR|SUMMARY|Test unit written' $(FUZZ_BUILD)/fuzz_$$t.log; \
		[ $$rc -eq 0 ] || { echo "fuzz_$$t failed (exit $$rc), see $(FUZZ_BUILD)/fuzz_$$t.log" >&2; exit 1; }; \
	done

$(BUILD)/fuzz/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o $(BUILD)/obj/tests/support/fuzz_scratch.o $(MODEL_STACK)
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)

# The token files' fuzzer reads them with the trainer's library.
$(BUILD)/fuzz/fuzz_data: $(BUILD)/obj/tests/fuzz/fuzz_data.o $(BUILD)/obj/tests/support/fuzz_scratch.o $(TRAINER_STACK)
	@mkdir -p $(dir $@)
	$(say) LD $@
	$(Q)$(CC) $(ALL_LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)

demo: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/demo.sh

bench-ckpt: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-ckpt.sh

bench-elastic: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-elastic.sh

bench-remote: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-remote.sh

bench-scale: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-scale.sh

bench-reshard: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-reshard.sh

bench-train: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-train.sh

bench-parallel: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-parallel.sh

bench-export: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-export.sh

bench-llama: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-llama.sh

bench-megatron: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-megatron.sh

bench-dcp: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-dcp.sh

bench-dcp-strided: deps
	+@$(SUBMAKE) build
	@BUILD=$(BUILD) scripts/bench-dcp-strided.sh

# This tree against BENCH_BASE (a revision), for changes that should cost nothing.
bench-revisions: deps
	@scripts/bench-revisions.sh

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
