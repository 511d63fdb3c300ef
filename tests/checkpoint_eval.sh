#!/usr/bin/env bash
# checkpoint_eval.sh MESHSCOPE SRC_DIR [CONFIG]: a checkpoint saved by a dp2 x tp2 run evaluates to the
# loss of one saved by the same training on one rank (so the save gathered every shard to its
# place), and to the same loss on one rank, on tp4, on dp2 x tp2, on dp2 x cp2 and on two
# pipelines (the file holds full tensors; each strategy shards them on load). A checkpoint
# saved by a pp2 x dp2 run evaluates alike too (the save gathers every stage's layers).
# CONFIG is the model (default configs/gpt-tiny.json).
set -u
bin=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=${3:-"$src/configs/gpt-tiny.json"}
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 300) >"$tmp/text.txt"
if ! "$bin" train --model "$model" --data "$tmp/text.txt" --dp 2 --tp 2 --steps 5 --batch 4 \
  --seq 32 --save "$tmp/ck.safetensors" >"$tmp/train.txt" 2>&1; then
  echo "FAIL training with --save"; cat "$tmp/train.txt"; exit 1
fi
if ! "$bin" train --model "$model" --data "$tmp/text.txt" --steps 5 --batch 4 --seq 32 \
  --save "$tmp/ck1.safetensors" >"$tmp/train1.txt" 2>&1; then
  echo "FAIL training on one rank with --save"; cat "$tmp/train1.txt"; exit 1
fi
if ! "$bin" train --model "$model" --data "$tmp/text.txt" --pp 2 --dp 2 --micro-batches 2 \
  --steps 5 --batch 4 --seq 32 --save "$tmp/ckpp.safetensors" >"$tmp/trainpp.txt" 2>&1; then
  echo "FAIL training pp2 x dp2 with --save"; cat "$tmp/trainpp.txt"; exit 1
fi
ev=("$bin" eval --model "$model" --checkpoint "$tmp/ck.safetensors" --data "$tmp/text.txt"
  --batch 4 --seq 32 --batches 2)
ref=$("${ev[@]}" | sed -n 's/.*"loss": \([0-9.]*\).*/\1/p')
[ -n "$ref" ] || { echo "FAIL: no loss from eval on one rank"; exit 1; }
one=$("$bin" eval --model "$model" --checkpoint "$tmp/ck1.safetensors" --data "$tmp/text.txt" \
  --batch 4 --seq 32 --batches 2 | sed -n 's/.*"loss": \([0-9.]*\).*/\1/p')
fail=0
# Training on 4 ranks equals one rank within 1e-5 per step (tests/test_train.c), hence 1e-4.
if awk -v a="$one" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-4 * a) }'; then
  echo "ok   the dp2 x tp2 checkpoint: $ref; the one-rank checkpoint: $one"
else
  echo "FAIL the dp2 x tp2 checkpoint evaluates to $ref, the one-rank one to '$one'"; fail=1
fi
for mesh in "--tp 4" "--dp 2 --tp 2" "--dp 2 --cp 2" "--pp 2 --dp 2" \
  "--pp 2 --tp 2 --schedule interleaved --virtual-stages 2 --micro-batches 2"; do
  # shellcheck disable=SC2086
  got=$("${ev[@]}" $mesh | sed -n 's/.*"loss": \([0-9.]*\).*/\1/p')
  if awk -v a="$ref" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 1e-5 * a) }'; then
    echo "ok   eval $mesh: $got (one rank: $ref)"
  else
    echo "FAIL eval $mesh: '$got' against $ref on one rank"; fail=1
  fi
done
pp=$("$bin" eval --model "$model" --checkpoint "$tmp/ckpp.safetensors" --data "$tmp/text.txt" \
  --batch 4 --seq 32 --batches 2 | sed -n 's/.*"loss": \([0-9.]*\).*/\1/p')
if awk -v a="$one" -v b="$pp" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 1e-4 * a) }'; then
  echo "ok   the pp2 x dp2 checkpoint: $pp; the one-rank checkpoint: $one"
else
  echo "FAIL the pp2 x dp2 checkpoint evaluates to '$pp', the one-rank one to $one"; fail=1
fi
exit $fail
