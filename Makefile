# specdec - build, run, test.
#   make run    build, fetch the default model if absent, generate text
#   make test   build and run every test; ends with "N passed, N failed"
#   make fuzz   build the GGUF parser fuzz target (clang, libFuzzer)
CC      ?= cc
OPT     ?= -O3 -march=native
CFLAGS  ?=
CFLAGS  += $(OPT) -std=c11 -Wall -Wextra -D_GNU_SOURCE -pthread -Iinclude -Isrc -MMD -MP
LDLIBS  += -lm -pthread

MODEL   ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT  ?= Write a short story about a robot who learns to paint.

SRC      := $(wildcard src/*.c src/*/*.c)
OBJ      := $(SRC:%.c=build/%.o)
LIB      := build/libspecdec.a
TOOL_OBJ := $(patsubst %.c,build/%.o,$(wildcard tools/*.c))
TLIB_OBJ := $(patsubst %.c,build/%.o,$(wildcard tests/lib/*.c))
TESTS    := $(patsubst tests/%.c,build/tests/%,$(wildcard tests/test_*.c))
# Examples see only include/ (the public API), never src/.
EXAMPLES := $(patsubst examples/%.c,build/examples/%,$(wildcard examples/*.c))

.PHONY: all run test fuzz clean models
.SECONDARY:
all: build/specdec $(TESTS) $(EXAMPLES)

build/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

build/specdec: $(TOOL_OBJ) $(LIB)
	$(CC) $(CFLAGS) $(TOOL_OBJ) $(LIB) $(LDLIBS) -o $@

build/examples/%: examples/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -std=c11 -Wall -Wextra -pthread -Iinclude $< $(LIB) $(LDLIBS) -o $@

build/tests/%: build/tests/%.o $(TLIB_OBJ) $(LIB)
	$(CC) $(CFLAGS) $< $(TLIB_OBJ) $(LIB) $(LDLIBS) -o $@

$(MODEL):
	bash scripts/fetch-models.sh

models: $(MODEL)

run: build/specdec $(MODEL)
	./build/specdec generate -m $(MODEL) --chat -p "$(PROMPT)" -n 200

# The model is fetched first; if that fails (no network) the tests that need
# it say so and are skipped.
test: build/specdec $(TESTS) $(EXAMPLES)
	@bash scripts/fetch-models.sh || echo "warning: could not fetch the default model; tests that need it will be skipped"
	@bash scripts/run-tests.sh $(TESTS)

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

-include $(OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TLIB_OBJ:.o=.d) $(TESTS:%=%.d)
