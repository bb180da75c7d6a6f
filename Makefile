# moerl — plain Makefile. `make` builds build/moerl; `make test` runs the suite;
# `make SANITIZE=address,undefined` builds a sanitizer variant under build-san/.
CC ?= cc
SANITIZE ?=
ifeq ($(SANITIZE),)
BUILD ?= build
OPT ?= -O3 -march=native
else
BUILD ?= build-san
OPT ?= -O1 -g -fno-omit-frame-pointer -fsanitize=$(SANITIZE)
endif
CFLAGS ?=
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare -Wno-format-truncation $(OPT) -Isrc -MMD -MP
LDLIBS += -lm -lpthread

# --- dependency detection (prints what it found) ---
HAVE_OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo 1)
ifeq ($(HAVE_OPENMP),1)
CFLAGS += -fopenmp
LDFLAGS += -fopenmp
$(info moerl: OpenMP found)
else
$(info moerl: OpenMP NOT found, building single-threaded kernels)
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

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

test: all
	BUILD=$(BUILD) bash tests/run.sh

clean:
	rm -rf build build-san

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
