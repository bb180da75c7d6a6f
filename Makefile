# moerl — plain Makefile. `make` builds build/moerl; `make test` runs the suite;
# `make SANITIZE=address,undefined` builds a sanitizer variant under build-san/;
# `make SANITIZE=thread` a ThreadSanitizer variant under build-tsan/ (OpenMP off: NO_OPENMP=1);
# `make fuzz` builds the libFuzzer targets of fuzz/ with clang under build-fuzz/ and runs each
# for FUZZ_SECONDS (fuzz/README.md). NO_OPENMP=1 builds single-threaded kernels.
CC ?= cc
SANITIZE ?=
comma := ,
ifeq ($(SANITIZE),)
BUILD ?= build
OPT ?= -O3 -march=native
else
ifneq ($(filter thread,$(subst $(comma), ,$(SANITIZE))),)
# ThreadSanitizer does not see libgomp's synchronisation (every OpenMP region reports false races):
# build without OpenMP so that a report is a real race between moerl's own threads.
BUILD ?= build-tsan
NO_OPENMP ?= 1
else
BUILD ?= build-san
endif
# -fno-sanitize-recover: a UBSan report aborts (non-zero exit) instead of printing and going on.
OPT ?= -O1 -g -fno-omit-frame-pointer -fsanitize=$(SANITIZE) -fno-sanitize-recover=all
endif
CFLAGS ?=
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare -Wno-format-truncation $(OPT) -Isrc -MMD -MP
LDLIBS += -lm -lpthread

# --- dependency detection (prints what it found) ---
ifneq ($(NO_OPENMP),1)
HAVE_OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo 1)
endif
ifeq ($(HAVE_OPENMP),1)
CFLAGS += -fopenmp
LDFLAGS += -fopenmp
$(info moerl: OpenMP found)
else
CFLAGS += -Wno-unknown-pragmas
$(info moerl: OpenMP off (NO_OPENMP=1 or not found), building single-threaded kernels)
endif
# Prefer Debian's OpenMP build of OpenBLAS: it shares libgomp's thread pool with moerl's own
# OpenMP kernels (the pthread build's threads fight them for the cores).
OPENBLAS_OMP_DIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
ifneq ($(wildcard $(OPENBLAS_OMP_DIR)/libopenblas.so),)
OPENBLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS := -L$(OPENBLAS_OMP_DIR) -Wl,-rpath,$(OPENBLAS_OMP_DIR) -lopenblas
else
OPENBLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null)
endif
ifeq ($(OPENBLAS_LIBS),)
$(error moerl: OpenBLAS not found (run scripts/setup.sh, which installs libopenblas-dev))
endif
$(info moerl: OpenBLAS found ($(OPENBLAS_LIBS)))
CFLAGS += $(OPENBLAS_CFLAGS)
LDLIBS += $(OPENBLAS_LIBS) -lyaml -ljansson
# Tokenizer: PCRE2 (the pre-tokenizer's Unicode regex) and utf8proc (NFC), both from Debian.
TOK_LIBS := $(shell pkg-config --libs libpcre2-8 libutf8proc 2>/dev/null)
ifeq ($(TOK_LIBS),)
$(error moerl: PCRE2 or utf8proc not found (run scripts/setup.sh, which installs libpcre2-dev and libutf8proc-dev))
endif
CFLAGS += $(shell pkg-config --cflags libpcre2-8 libutf8proc 2>/dev/null)
LDLIBS += $(TOK_LIBS)
# libcurl: reward servers (reward.url, src/reward/http.c)
CURL_LIBS := $(shell pkg-config --libs libcurl 2>/dev/null)
ifeq ($(CURL_LIBS),)
$(error moerl: libcurl not found (Debian: libcurl4-openssl-dev; bash scripts/setup.sh installs it))
endif
LDLIBS += $(CURL_LIBS)
# jemalloc (optional, for MOERL_ALLOC=jemalloc): the header gives mallocx's flags; the library is
# never linked, because Debian's libjemalloc exports unprefixed malloc/free and linking it would
# replace glibc's malloc for the whole process (then MOERL_ALLOC=malloc would measure jemalloc too).
# src/base/pool.c uses it when started with LD_PRELOAD=libjemalloc.so.2, or loads it with
# dlopen(RTLD_LOCAL) under GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 (src/base/pool.h).
HAVE_JEMALLOC := $(shell test -f /usr/include/jemalloc/jemalloc.h && echo 1)
ifeq ($(HAVE_JEMALLOC),1)
CFLAGS += -DMOERL_HAVE_JEMALLOC
LDLIBS += -ldl
$(info moerl: jemalloc found (MOERL_ALLOC=jemalloc loads libjemalloc.so.2 at run time))
else
$(info moerl: jemalloc NOT found (libjemalloc-dev): MOERL_ALLOC=jemalloc unavailable)
endif
ifneq ($(SANITIZE),)
LDFLAGS += -fsanitize=$(SANITIZE)
$(info moerl: sanitizers $(SANITIZE))
endif

LIB_SRC := $(shell find src -name '*.c' ! -path 'src/cli/*' ! -path 'src/dist/mpi*' | sort)
CLI_SRC := $(shell find src/cli -name '*.c' | sort)
TEST_SRC := $(wildcard tests/test_*.c)
BENCH_SRC := $(wildcard bench/bench_*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test bench clean
all: $(BUILD)/moerl $(TEST_BIN) $(BENCH_BIN)

$(BUILD)/libmoerl.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

$(BUILD)/moerl: $(CLI_OBJ) $(BUILD)/libmoerl.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/test.h $(BUILD)/libmoerl.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $(LDFLAGS) -o $@ $< $(BUILD)/libmoerl.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libmoerl.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libmoerl.a $(LDLIBS)

# The verl adapter (src/reward/verl_adapter.py) as a C string in a generated header, so that the binary
# carries it: each line escaped (\ " ? — no trigraphs) and ended with \n.
$(BUILD)/gen/reward/verl_adapter.h: src/reward/verl_adapter.py
	@mkdir -p $(dir $@)
	{ echo '/* generated from src/reward/verl_adapter.py by the Makefile */'; echo 'static const char reward_verl_adapter_py[] ='; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/?/\\?/g' -e 's/^/    "/' -e 's/$$/\\n"/' $<; echo '    ;'; } > $@.tmp && mv $@.tmp $@
$(BUILD)/obj/src/reward/proc.o: $(BUILD)/gen/reward/verl_adapter.h
$(BUILD)/obj/src/reward/proc.o: CFLAGS += -I$(BUILD)/gen

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

test: all
	BUILD=$(BUILD) bash tests/run.sh

clean:
	rm -rf build build-san build-tsan build-fuzz

# --- fuzzing (libFuzzer from Debian's clang, with ASan + UBSan; fuzz/README.md) ---
# `make fuzz` builds every fuzz/fuzz_<name>.c into build-fuzz/fuzz/fuzz_<name> (the library compiled
# by clang with -fsanitize=fuzzer-no-link,address,undefined, OpenMP and MPI off), replays the
# committed regression inputs, then fuzzes each target for FUZZ_SECONDS (default 60) from its seed
# corpus fuzz/corpus/<name>/ (new inputs go to build-fuzz/corpus/<name>/, crashes to
# build-fuzz/artifacts/<name>/). `make fuzz-build` only builds.
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
.PHONY: fuzz fuzz-build fuzz-bins
fuzz-build:
	$(MAKE) --no-print-directory CC=$(FUZZ_CC) BUILD=build-fuzz SANITIZE=address,undefined NO_OPENMP=1 NO_MPI=1 \
	    FUZZ_LIB=1 fuzz-bins
fuzz: fuzz-build
	bash fuzz/run.sh $(FUZZ_SECONDS)
ifeq ($(FUZZ_LIB),1)
# clang warns about GCC-only warning flags; coverage instrumentation for libFuzzer everywhere
CFLAGS += -Wno-unknown-warning-option -fsanitize=fuzzer-no-link
fuzz-bins: $(FUZZ_SRC:fuzz/%.c=$(BUILD)/fuzz/%)
$(BUILD)/fuzz/%: fuzz/%.c fuzz/fuzz_common.h $(BUILD)/libmoerl.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Ifuzz -fsanitize=fuzzer $(LDFLAGS) -o $@ $< $(BUILD)/libmoerl.a $(LDLIBS)
endif

# --- MPI build (optional; NO_MPI=1 skips it) ---
# With mpicc: build/moerl-mpi = the same CLI and library objects, but src/dist/mpi_dist.c (compiled by
# mpicc with -DMOERL_MPI) replaces src/dist/dist_local.c; plus the MPI test and bench binaries under
# $(BUILD)/mpi/ (tests/e2e_mpi.sh and bench/run_dist.sh run them with mpirun). Only src/dist/ talks MPI,
# so no other object needs recompiling.
MPICC ?= mpicc
ifneq ($(NO_MPI),1)
HAVE_MPI := $(shell command -v $(MPICC) >/dev/null 2>&1 && echo 1)
endif
ifeq ($(HAVE_MPI),1)
$(info moerl: MPI found ($(MPICC)): building $(BUILD)/moerl-mpi and the MPI tests)
MPI_LIB_OBJ := $(filter-out $(BUILD)/obj/src/dist/dist_local.o,$(LIB_OBJ)) $(BUILD)/mpi/obj/src/dist/mpi_dist.o
MPI_TEST_BIN := $(patsubst tests/%.c,$(BUILD)/mpi/tests/%,$(wildcard tests/test_dist*.c))
MPI_BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/mpi/bench/%,$(wildcard bench/bench_dist_*.c bench/bench_weight_sync.c))
all: $(BUILD)/moerl-mpi $(MPI_TEST_BIN) $(MPI_BENCH_BIN)

$(BUILD)/mpi/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DMOERL_MPI -c -o $@ $<

$(BUILD)/mpi/libmoerl-mpi.a: $(MPI_LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/moerl-mpi: $(CLI_OBJ) $(BUILD)/mpi/libmoerl-mpi.a
	$(MPICC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/mpi/tests/%: tests/%.c tests/test.h $(BUILD)/mpi/libmoerl-mpi.a
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DMOERL_MPI -Itests $(LDFLAGS) -o $@ $< $(BUILD)/mpi/libmoerl-mpi.a $(LDLIBS)

$(BUILD)/mpi/bench/%: bench/%.c $(BUILD)/mpi/libmoerl-mpi.a
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DMOERL_MPI $(LDFLAGS) -o $@ $< $(BUILD)/mpi/libmoerl-mpi.a $(LDLIBS)

-include $(shell find $(BUILD)/mpi -name '*.d' 2>/dev/null)
else
$(info moerl: MPI not found (no $(MPICC) on PATH, or NO_MPI=1): skipping $(BUILD)/moerl-mpi and the MPI tests)
endif

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
