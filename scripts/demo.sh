#!/usr/bin/env bash
# The live demo (`make run`): a small GPT trains on the King James Bible on 4 thread ranks,
# starting from a deliberately poor strategy (tp4: four all-reduces per layer on a model too
# small to need them), with the TUI in this terminal and the dashboard on localhost. The
# advisor suggests a better strategy within the first minute; accept it in the TUI
# (screen 6, Enter, y) or with the dashboard's Accept button, and the job switches without
# a restart. q ends the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./build/meshscope
$bin demo --ranks 4
echo
args=(--model configs/gpt-tiny.json --data data/kjv.txt --tp 4 --batch 8 --seq 64 --lr 3e-3
      --min-lr 3e-4 --log-every 50 --log-jsonl build/train.jsonl --web 127.0.0.1:0 --sample 300)
if [ -t 0 ] && [ -t 1 ]; then
  # Interactive: runs until q (the dashboard URL is also on the TUI's overview screen).
  $bin train "${args[@]}" --steps 1000000 --tui
else
  echo "(no terminal: running 600 steps without the TUI; the dashboard URL follows)"
  $bin train "${args[@]}" --steps 600 --save build/gpt-tiny.safetensors
fi
echo "the run's log: build/train.jsonl"
