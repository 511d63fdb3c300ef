# meshscope: the two commands of the README.
#   make run   installs missing Debian packages, builds, and starts the live training demo
#   make test  installs missing packages, then runs the whole test suite (plain, ASan+UBSan, TSan)
.PHONY: run test build deps format clean

JOBS ?= $(shell nproc)

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build.configure.log 2>&1 || (cat build.configure.log; exit 1)
	@cmake --build build -j $(JOBS) >build.build.log 2>&1 || (tail -40 build.build.log; exit 1)

# The demo: distributed tensors on a 2x2 mesh, then a GPT trained live by 4 thread ranks with
# the TUI in the terminal and the dashboard at the printed URL (scripts/demo.sh).
run: build
	@scripts/prepare-data.sh
	@scripts/demo.sh

test: deps
	@scripts/prepare-data.sh
	@scripts/run-tests.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan build*.log
