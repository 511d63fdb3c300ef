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

# The demo: distributed tensors on a 2x2 mesh, then a GPT trained on the King James Bible by
# 4 thread ranks (dp2 x tp2), ending with a text sample, a trace and its analysis.
run: build
	@scripts/prepare-data.sh
	./build/meshscope demo --ranks 4
	./build/meshscope train --model configs/gpt-tiny.json --data data/kjv.txt --dp 2 --tp 2 \
	  --steps 400 --batch 8 --seq 64 --lr 3e-3 --log-every 25 --sample 300 \
	  --log-jsonl build/train.jsonl --save build/gpt-tiny.safetensors --trace build/trace.json \
	  --trace-from 390
	./build/meshscope trace summary build/trace.json --steps 390:399
	@echo "build/trace.json opens in Perfetto or chrome://tracing"

test: deps
	@scripts/run-tests.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan build*.log
