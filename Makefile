# corefit — top-level driver around CMake.
#   make            build (Release) into build/
#   make test       install missing Debian packages, build, run every test through ctest
#   make test-asan  the same with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   make bench      side-by-side benchmarks against PyTorch (bench/: W1, then W4)
#   make demo       install missing packages, build, train the default model on every core
#   make install    install library, headers, pkg-config and CMake files (PREFIX=/usr/local)
#   make fuzz       run each libFuzzer target for FUZZ_SECONDS (clang)
#   make soak       fault soak of the parallel fits for SOAK_SECONDS (tests/test_soak.c)
#   make test-valgrind  the unit tests under valgrind memcheck (build-valgrind/; valgrind
#                       reports no AVX-512, so the AVX2 kernels run)
#   make format     apply .clang-format to all C code
BUILD     ?= build
PREFIX    ?= /usr/local
JOBS      ?= $(shell nproc)
CTEST_ARGS ?=
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 300
VALGRIND_TESTS ?= .

.PHONY: all build deps test test-asan test-valgrind soak bench demo install fuzz format clean

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

# The fault soak: every kind of worker fault on random ranks and batches, for SOAK_SECONDS
# (`make test` runs a few seconds of it). CF_SOAK_SEED=n repeats a sequence.
soak: deps build
	cd $(BUILD)/tests && OPENBLAS_NUM_THREADS=1 CF_SOAK_SECONDS=$(SOAK_SECONDS) ./test_soak

# valgrind cannot run AVX-512 and hides it from cpuid: the portable build picks its AVX2 kernels
# there by itself; OpenBLAS is held to its Haswell kernels.
# Every unit test matching VALGRIND_TESTS (a grep -E pattern) runs under memcheck, forked
# workers included; any error or definite leak fails. Reports go to build-valgrind/valgrind/.
build-valgrind/CMakeCache.txt:
	cmake -S . -B build-valgrind -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCF_NATIVE=OFF

test-valgrind: deps build-valgrind/CMakeCache.txt
	cmake --build build-valgrind -j $(JOBS)
	@mkdir -p build-valgrind/valgrind
	@cd build-valgrind/tests && ls test_* | grep -v '^test_e2e_' | grep -E '$(VALGRIND_TESTS)' | \
	  OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell CF_TEST_TIME_SCALE=30 xargs -P $(JOBS) -I{} sh -c \
	  'if valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
	      --show-leak-kinds=definite --child-silent-after-fork=no \
	      --suppressions=$(CURDIR)/tests/valgrind.supp --log-file=../valgrind/{}.%p.log \
	      ./{} >../valgrind/{}.out 2>&1; then echo "valgrind: {} clean"; \
	   else echo "valgrind: {} FAILED (build-valgrind/valgrind/{}.*)"; exit 1; fi'

bench: deps build
	/usr/bin/python3 bench/run.py --build $(BUILD)
	/usr/bin/python3 bench/run.py --build $(BUILD) --workload w4 --only 1t,dp

demo: deps build
	bash scripts/demo $(BUILD)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

fuzz: deps
	bash fuzz/run $(FUZZ_SECONDS)

format:
	find include src tests bench examples fuzz tools -name '*.[ch]' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-valgrind
