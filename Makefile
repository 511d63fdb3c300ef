# meshscope: the two commands of the README.
#   make run   installs missing Debian packages, builds, and starts the main demo
#   make test  installs missing packages, then runs the whole test suite (plain, ASan+UBSan, TSan)
.PHONY: run test build deps format clean

JOBS ?= $(shell nproc)

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build.configure.log 2>&1 || (cat build.configure.log; exit 1)
	@cmake --build build -j $(JOBS) >build.build.log 2>&1 || (tail -40 build.build.log; exit 1)

run: build
	./build/meshscope demo --ranks 4

test: deps
	@scripts/run-tests.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan build*.log
