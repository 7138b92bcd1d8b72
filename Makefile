# specdec - build, run, test.
#   make run    build, fetch the default model if absent, generate text
#   make test   build and run every test; ends with "N passed, N failed"
#   make fuzz   build the GGUF parser fuzz target (clang, libFuzzer)
#   make asan-serve  build specdec with AddressSanitizer and run the server (and page) tests on it
#   make docs   regenerate docs/cli.md (the command-line reference) from specdec's --help
CC      ?= cc
OPT     ?= -O3 -march=native
CFLAGS  ?=
CFLAGS  += $(OPT) -std=c11 -Wall -Wextra -D_GNU_SOURCE -pthread -Iinclude -Isrc -MMD -MP
LDLIBS  += -lm -pthread

MODEL   ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT  ?= Write a short story about a robot who learns to paint.

SRC      := $(wildcard src/*.c src/*/*.c)
# The CUDA path (docs/gpu.md): `make CUDA=1` compiles src/runtime/cuda/*.cu
# with nvcc (SASS for sm_90a and sm_80, nothing left to JIT) into the same
# library and links cudart and cuBLAS dynamically; the default build takes
# src/runtime/gpu_none.c instead and stays dependency-free. A CUDA build
# lives in build/ like any other: `make clean` between the two.
CUDA    ?= 0
NVCC    ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80
ifeq ($(CUDA),1)
SRC      := $(filter-out src/runtime/gpu_none.c,$(SRC))
CU_SRC   := $(wildcard src/runtime/cuda/*.cu)
CU_OBJ   := $(CU_SRC:%.cu=build/%.o)
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
else
CU_OBJ   :=
endif
OBJ      := $(SRC:%.c=build/%.o) $(CU_OBJ)
LIB      := build/libspecdec.a
LIB_SO   := build/libspecdec.so
# The commands (tools/*.c) but serve's, which comes with the server or, without
# libmicrohttpd, as its stub (tools/cmd_serve_missing.c).
SERVE_CMD := tools/cmd_serve.c tools/cmd_serve_missing.c
CLIENT_CMD := tools/cmd_client.c tools/cmd_client_missing.c
TOOL_OBJ := $(patsubst %.c,build/%.o,$(filter-out $(SERVE_CMD) $(CLIENT_CMD),$(wildcard tools/*.c)))
# build/specdec needs jansson (JSON: the --json outputs, bench's prompt files
# and results, the server's API), found with pkg-config; without it make stops
# at need-jansson and says what to install. The server (tools/serve/, `specdec
# serve`) also needs libmicrohttpd (HTTP); without it specdec is built without
# serve, whose command then says how to install it. Only build/specdec (and
# the tests that compile tools' files) link them: build/libspecdec.a and
# examples/ stay dependency-free.
JSON_INSTALL := apt-get install libjansson-dev pkg-config
HAVE_JSON   := $(shell pkg-config --exists jansson 2>/dev/null && echo 1)
ifeq ($(HAVE_JSON),1)
JSON_CFLAGS := $(shell pkg-config --cflags jansson)
JSON_LIBS   := $(shell pkg-config --libs jansson)
endif
build/tools/%.o: CFLAGS += $(JSON_CFLAGS)
# Tests sit in folders that mirror src/ (tests/kernels, tests/model, ...) and
# include the harness (t.h), tests/lib and, for the CLI's own files, tools/
# from the repository root.
build/tests/%.o: CFLAGS += -Itests -I.
build/tools/%.o: CFLAGS += -Itools
SERVE_PKGS := libmicrohttpd jansson
HAVE_SERVE := $(shell pkg-config --exists $(SERVE_PKGS) 2>/dev/null && echo 1)
ifeq ($(HAVE_SERVE),1)
SERVE_OBJ  := build/tools/cmd_serve.o $(patsubst %.c,build/%.o,$(wildcard tools/serve/*.c))
SERVE_LIBS := $(shell pkg-config --libs libmicrohttpd)
build/tools/serve/%.o: CFLAGS += $(shell pkg-config --cflags libmicrohttpd)
else
SERVE_OBJ  := build/tools/cmd_serve_missing.o
SERVE_LIBS :=
ifeq ($(HAVE_JSON),1)
$(warning libmicrohttpd not found by pkg-config: building specdec without 'serve' (install it: apt-get install libmicrohttpd-dev))
endif
endif
# The split client (tools/client/, `specdec client`, docs/split.md) needs
# libcurl; without it the command says how to install it.
HAVE_CLIENT := $(shell pkg-config --exists libcurl 2>/dev/null && echo 1)
ifeq ($(HAVE_CLIENT),1)
CLIENT_OBJ  := build/tools/cmd_client.o $(patsubst %.c,build/%.o,$(wildcard tools/client/*.c))
CLIENT_LIBS := $(shell pkg-config --libs libcurl)
build/tools/client/%.o: CFLAGS += $(shell pkg-config --cflags libcurl)
else
CLIENT_OBJ  := build/tools/cmd_client_missing.o
CLIENT_LIBS :=
endif
# Pipeline parallelism over MPI (docs/mpi.md): `make MPI=1` builds
# build/specdec with mpicc and tools/mpi/pp.c + pp_worker.c (Open MPI:
# apt-get install openmpi-bin libopenmpi-dev); the default build links
# tools/mpi/pp_none.c, which refuses --pp with a message. The library never
# sees MPI. build/pp-mode records which one build/specdec was linked with,
# so switching relinks it.
MPICC ?= mpicc
ifeq ($(MPI),1)
PP_MODE := mpi
PP_OBJ  := build/tools/mpi/pp.o build/tools/mpi/pp_worker.o build/tools/mpi/pp_flight.o
LINK_CC := $(MPICC)
build/tools/mpi/pp.o build/tools/mpi/pp_worker.o build/tools/mpi/pp_flight.o: CC := $(MPICC)
else
PP_MODE := none
PP_OBJ  := build/tools/mpi/pp_none.o
LINK_CC := $(CC)
endif
# (checked when the Makefile is read: a recipe that touched it would come
# too late for make's view of build/specdec)
ifneq ($(shell cat build/pp-mode 2>/dev/null),$(PP_MODE))
$(shell mkdir -p build && echo $(PP_MODE) > build/pp-mode && rm -f build/specdec)
endif
TLIB_OBJ := $(patsubst %.c,build/%.o,$(wildcard tests/lib/*.c))
TESTS    := $(patsubst tests/%.c,build/tests/%,$(wildcard tests/*/test_*.c))
# Helper programs of the test scripts and of measurements (tests/tool_*.c,
# e.g. a random draft head for test_serve.py, tool_kernel_bench for kernel
# work): built like the tests, never run as tests.
TEST_TOOLS := $(patsubst tests/%.c,build/tests/%,$(wildcard tests/tool_*.c))
# These tests compile tools' own files (cli_common.c, bench_prompts.c).
JSON_TESTS := build/tests/cli/test_cli_options build/tests/cli/test_generate_bench
# Test scripts (executable, print PASS/FAIL/SKIP lines like the C tests).
TEST_SCRIPTS := $(wildcard tests/*/test_*.py)
# Examples see only include/ (the public API), never src/.
EXAMPLES := $(patsubst examples/%.c,build/examples/%,$(wildcard examples/*.c))

.PHONY: all run run-only test test-only test-mpi setup fuzz clean models datastore asan-serve need-jansson docs
.SECONDARY:
all: build/specdec $(LIB_SO) $(TESTS) $(TEST_TOOLS) $(EXAMPLES)

build/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# CUDA sources: -Xptxas -v reports each kernel's registers and spills into
# the .ptxas log beside the object (scripts/check-cuda-build.sh reads it).
NVCC_FLAGS := -std=c++17 -O3 $(CUDA_ARCH) -Iinclude -Isrc -Xcompiler -fPIC,-fvisibility=hidden -Xptxas -v
build/%.o: %.cu $(wildcard src/runtime/cuda/*.h src/runtime/gpu.h src/kernels/elem.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@ 2> $(@:.o=.ptxas) || { cat $(@:.o=.ptxas); exit 1; }

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

# The library's objects are position-independent, so that the same objects
# make build/libspecdec.a and build/libspecdec.so. The shared library exports
# exactly the functions that include/ declares (a version script made from
# the headers; tests/house/test_exports.py checks its dynamic symbols).
build/src/%.o: CFLAGS += -fPIC -fvisibility=hidden
build/specdec.map: scripts/export-map.sh $(wildcard include/*.h)
	@mkdir -p build
	sh scripts/export-map.sh $(wildcard include/*.h) > $@
$(LIB_SO): $(OBJ) build/specdec.map
	$(CC) -shared -Wl,--version-script=build/specdec.map $(OBJ) $(LDLIBS) -o $@

# Stops the build of anything that needs jansson when pkg-config cannot find it.
need-jansson:
	@test "$(HAVE_JSON)" = 1 || { echo "specdec needs jansson (JSON) and pkg-config cannot find it; install them: $(JSON_INSTALL)" >&2; exit 1; }
$(TOOL_OBJ) $(SERVE_OBJ) $(CLIENT_OBJ) $(JSON_TESTS:%=%.o): | need-jansson
$(JSON_TESTS:%=%.o): CFLAGS += $(JSON_CFLAGS)
$(JSON_TESTS): LDLIBS += $(JSON_LIBS)

build/specdec: $(TOOL_OBJ) $(SERVE_OBJ) $(CLIENT_OBJ) $(PP_OBJ) $(LIB)
	$(LINK_CC) $(CFLAGS) $(TOOL_OBJ) $(SERVE_OBJ) $(CLIENT_OBJ) $(PP_OBJ) $(LIB) $(SERVE_LIBS) $(CLIENT_LIBS) $(JSON_LIBS) $(LDLIBS) -o $@

build/examples/%: examples/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -std=c11 -Wall -Wextra -pthread -Iinclude $< $(LIB) $(LDLIBS) -o $@

build/tests/%: build/tests/%.o $(TLIB_OBJ) $(LIB)
	$(CC) $(CFLAGS) $< $(TLIB_OBJ) $(LIB) $(LDLIBS) -o $@

# The server's draft budget is program code (tools/serve/budget.c), tested on its own.
build/tests/serve/test_draft_budget.o: CFLAGS += -Itools
build/tests/serve/test_draft_budget: build/tests/serve/test_draft_budget.o build/tools/serve/budget.o $(TLIB_OBJ) $(LIB)
	$(CC) $(CFLAGS) $< build/tools/serve/budget.o $(TLIB_OBJ) $(LIB) $(LDLIBS) -o $@

$(MODEL):
	bash scripts/fetch-models.sh

models: $(MODEL)

# The models' datastores, from the committed corpora (scripts/make-datastore.py):
# the default model's own answers, greedy and sampled (21 MB, 3 s), and
# Qwen2.5-Coder-1.5B's (its own and the 0.5B model's answers, 4.4 MB).
# `--head auto` (generate, serve) and `--datastore auto` find them by the
# model's name; the n-gram lookup indexes one to FILE.sdsa on first use (10 s).
DATASTORE = data/datastore/SmolLM2-135M-Instruct.txt
DATASTORE_QWEN = data/datastore/Qwen2.5-Coder-1.5B-Instruct.txt
$(DATASTORE): $(wildcard data/corpus/smollm2/*.jsonl.xz) scripts/make-datastore.py
	python3 scripts/make-datastore.py --corpus data/corpus/smollm2 --out $@
$(DATASTORE_QWEN): $(wildcard data/corpus/qwen2.5-coder-*/*.jsonl.xz) scripts/make-datastore.py
	python3 scripts/make-datastore.py --corpus data/corpus/qwen2.5-coder-1.5b --corpus data/corpus/qwen2.5-coder-0.5b --out $@

datastore: $(DATASTORE) $(DATASTORE_QWEN)

# `make run` and `make test` first install what is missing (scripts/setup.sh:
# Debian packages as root or through sudo, else it prints the command), then
# run make again so that pkg-config's answers are read afresh.
setup:
	@bash scripts/setup.sh test

run:
	@bash scripts/setup.sh build
	@$(MAKE) --no-print-directory run-only

run-only: build/specdec $(MODEL) datastore
	./build/specdec generate -m $(MODEL) --chat -p "$(PROMPT)" -n 200 --head auto

# The model is fetched first; if that fails (no network) the tests that need
# it say so and are skipped.
test:
	@bash scripts/setup.sh test
	@$(MAKE) --no-print-directory test-only

test-only: build/specdec $(LIB_SO) $(TESTS) $(TEST_TOOLS) $(EXAMPLES) datastore
	@bash scripts/fetch-models.sh || echo "warning: could not fetch the default model; tests that need it will be skipped"
	@bash scripts/run-tests.sh $(TESTS) $(TEST_SCRIPTS)

# The pipeline-parallel target over MPI (docs/mpi.md): build/specdec relinked
# with MPI=1, then tests/mpi under mpirun --oversubscribe (as root, Open MPI
# needs the two OMPI_ALLOW_RUN_AS_ROOT variables). A later plain `make`
# relinks it without MPI.
test-mpi:
	@$(MAKE) --no-print-directory MPI=1 build/specdec build/tests/tool_synth_model build/tests/tool_random_head
	@OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash scripts/run-tests.sh $(wildcard tests/mpi/test_*.py)

# docs/cli.md is generated from the --help of every command
# (tests/cli/test_cli_doc.py fails when it is out of date).
docs: docs/cli.md
docs/cli.md: build/specdec scripts/gen-cli-doc.py
	python3 scripts/gen-cli-doc.py --bin build/specdec --out $@

# The whole program (library, tools, server) built with AddressSanitizer and
# UndefinedBehaviorSanitizer into build/asan/specdec, then the server tests
# run on it (a leak or an error at the server's exit fails them).
ASAN_FLAGS := -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -march=native -std=c11 -Wall -Wextra \
	-D_GNU_SOURCE -pthread -Iinclude -Isrc -Itools
asan-serve: build/asan/specdec $(TEST_TOOLS)
	@SPECDEC_BIN=build/asan/specdec UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		bash scripts/run-tests.sh tests/serve/test_serve.py tests/serve/test_serve_budget.py tests/serve/test_page.py tests/serve/test_datastore.py
ASAN_CLIENT := $(if $(filter 1,$(HAVE_CLIENT)),tools/cmd_client.c $(wildcard tools/client/*.c),tools/cmd_client_missing.c)
build/asan/specdec: $(SRC) $(wildcard tools/*.c tools/*.h tools/serve/*.c tools/serve/*.h tools/client/*.c tools/client/*.h tools/mpi/*.h src/*.h src/*/*.h include/*.h) tools/mpi/pp_none.c
	@mkdir -p $(dir $@)
	@test "$(HAVE_SERVE)" = 1 || { echo "asan-serve needs libmicrohttpd and jansson (apt-get install libmicrohttpd-dev libjansson-dev pkg-config)"; exit 1; }
	$(CC) $(ASAN_FLAGS) $(shell pkg-config --cflags $(SERVE_PKGS)) $(SRC) \
		$(filter-out tools/cmd_serve_missing.c $(CLIENT_CMD),$(wildcard tools/*.c)) $(ASAN_CLIENT) $(wildcard tools/serve/*.c) tools/mpi/pp_none.c \
		$(SERVE_LIBS) $(CLIENT_LIBS) $(JSON_LIBS) $(LDLIBS) -o $@

# Only the parser and its getters (and the target) are instrumented; what they
# call from the rest of the library (sd_err, sd_type_get) comes from the library
# archive, whose gguf.o and gguf_get.o are never pulled in because
# src/model/gguf.c and gguf_get.c define those symbols.
# Run: mkdir -p /tmp/gguf-fuzz/corpus && build/fuzz_gguf -artifact_prefix=/tmp/gguf-fuzz/ /tmp/gguf-fuzz/corpus tests/data/gguf-bad
FUZZ_SRC := src/model/gguf.c src/model/gguf_get.c
fuzz: build/fuzz_gguf
build/fuzz_gguf: tests/fuzz/fuzz_gguf.c $(FUZZ_SRC) $(LIB)
	@mkdir -p build
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -std=c11 -Wall -Wextra \
		-D_GNU_SOURCE -Iinclude -Isrc tests/fuzz/fuzz_gguf.c $(FUZZ_SRC) $(LIB) $(LDLIBS) -o $@

clean:
	rm -rf build

-include $(OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(SERVE_OBJ:.o=.d) $(PP_OBJ:.o=.d) $(TLIB_OBJ:.o=.d) $(TESTS:%=%.d) $(TEST_TOOLS:%=%.d)
