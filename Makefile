# corefit — top-level driver around CMake.
#   make            build (Release) into build/
#   make test       install missing Debian packages, build, run every test through ctest
#   make test-asan  the same with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   make bench      side-by-side benchmarks against PyTorch (bench/)
#   make demo       install missing packages, build, train the default model on every core
#   make install    install library, headers, pkg-config and CMake files (PREFIX=/usr/local)
#   make fuzz       run each libFuzzer target for FUZZ_SECONDS (clang)
#   make format     apply .clang-format to all C code
BUILD     ?= build
PREFIX    ?= /usr/local
JOBS      ?= $(shell nproc)
CTEST_ARGS ?=
FUZZ_SECONDS ?= 60

.PHONY: all build deps test test-asan bench demo install fuzz format clean

all: build

deps:
	@bash scripts/install-deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

build-asan/CMakeCache.txt:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCF_SANITIZE=ON

test-asan: deps build-asan/CMakeCache.txt
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -L unit $(CTEST_ARGS)

bench: deps build
	/usr/bin/python3 bench/run.py --build $(BUILD)

demo: deps build
	bash scripts/demo $(BUILD)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

fuzz: deps
	bash fuzz/run $(FUZZ_SECONDS)

format:
	find include src tests bench examples fuzz tools -name '*.[ch]' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-asan build-fuzz
