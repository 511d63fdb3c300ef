#!/usr/bin/env bash
# Bad input to the CLI: each case must exit non-zero (never crash: no exit code >= 128) and
# print an error that names the problem. Then every command's --help (and -h) exits 0 and lists
# each of its flags, and an unknown flag exits 2 with the closest one suggested.
# Usage: cli_errors.sh path/to/meshscope [hardening]
# ("hardening": only the inputs that once crashed it).
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

# expect NAME WANTED-TEXT COMMAND...
expect() {
  local name=$1 want=$2
  shift 2
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name (exit $rc): wanted '$want' in:"
    echo "$out" | head -5
    fail=$((fail + 1))
  else
    echo "ok   $name: $(grep -F -- "$want" <<<"$out" | head -1)"
    pass=$((pass + 1))
  fi
}

cat >"$tmp/ok.json" <<'J'
{"n_layer": 1, "n_head": 4, "n_embd": 32, "vocab_size": 256, "n_positions": 32}
J
cat >"$tmp/bad-div.json" <<'J'
{"n_layer": 1, "n_head": 5, "n_embd": 32, "vocab_size": 256, "n_positions": 32}
J
printf '{"n_layer": 1, "n_head": "four", "n_embd": 32, "vocab_size": 256, "n_positions": 32}' >"$tmp/bad-type.json"
printf '{"n_layer": 1, "n_head": 4,' >"$tmp/truncated.json"
printf '{"mesh": {"dp": 2, "tp": "two"}}' >"$tmp/bad-strategy.json"
printf '{"mesh": {"dp": 1, "tp": 2}, "placements": {"h.*.mlp.c_fc.weight": "[R, S(7)]"}}' >"$tmp/bad-placement.json"
printf '{"dp": 1, "tp": 2, "zero": 1}' >"$tmp/zero-dp1.json"
printf '{"dp": 2, "zero": 4}' >"$tmp/zero4.json"
printf '{"dp": 2, "bucket_mb": -1}' >"$tmp/bucket-neg.json"
head -c 3000 /dev/urandom | tr -dc 'a-z \n' >"$tmp/text.txt" 2>/dev/null || true
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 200) >"$tmp/text.txt"
: >"$tmp/empty.txt"
printf 'short' >"$tmp/short.txt"

run=("$bin" train --model "$tmp/ok.json" --steps 1 --batch 2 --seq 16)

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}

if [ "${2:-}" = hardening ]; then
  # Degrees whose product overflowed an int to 0, which was then divided by (SIGFPE).
  huge="dp 4096 x tp 4096 x cp 4096 needs more than 4096 ranks"
  printf '{"mesh": {"dp": 4096, "tp": 4096, "cp": 4096}}' >"$tmp/huge.json"
  expect "train huge mesh" "$huge" "${run[@]}" --data "$tmp/text.txt" --dp 4096 --tp 4096 --cp 4096
  expect "explain huge mesh" "$huge" "$bin" explain --model "$tmp/ok.json" --dp 4096 --tp 4096 --cp 4096
  hugejson="the mesh dp4096 x tp4096 x pp1 x cp4096 has more than"
  expect "train huge strategy file" "huge.json: \$.mesh: $hugejson" "${run[@]}" --data "$tmp/text.txt" \
    --strategy "$tmp/huge.json"
  expect "explain huge strategy file" "$hugejson" "$bin" explain --model "$tmp/ok.json" --strategy "$tmp/huge.json"
  expect "switch to a huge mesh" "--switch: \$: $hugejson" "${run[@]}" --data "$tmp/text.txt" \
    --switch '1:{"dp": 4096, "tp": 4096, "cp": 4096}'
  expect "mesh larger than the world" "needs 4 ranks but the job runs on 2" "${run[@]}" \
    --data "$tmp/text.txt" --dp 2 --switch '1:{"dp": 2, "tp": 2}'
  expect "timeout zero" "bad value '0' for --timeout-s" "${run[@]}" --data "$tmp/text.txt" --timeout-s 0
  expect "timeout not a number" "bad value 'soon' for --timeout-s" "${run[@]}" --data "$tmp/text.txt" \
    --timeout-s soon
  # Outputs that cannot be written were found only after the whole run: a run that would
  # take hours must fail at once (timeout 60 turns a late failure into a failed case).
  long=("$bin" train --model "$tmp/ok.json" --steps 100000000 --batch 2 --seq 16 --data "$tmp/text.txt")
  expect "save names a directory" "--save $tmp is a directory" timeout 60 "${long[@]}" --save "$tmp"
  expect "save in an unwritable place" "cannot create files in /proc" timeout 60 "${long[@]}" \
    --save /proc/x.safetensors
  expect "trace in an unwritable place" "--trace /proc/t.json: cannot create files" timeout 60 \
    "${long[@]}" --trace /proc/t.json
  expect "log names a directory" "--log-jsonl $tmp is a directory" timeout 60 "${long[@]}" \
    --log-jsonl "$tmp"
  # A full disk under the log: the run fails naming it instead of exiting 0 with a cut log.
  expect "log on a full disk" "cannot write the log /dev/full" "${run[@]}" --data "$tmp/text.txt" \
    --steps 3 --log-jsonl /dev/full
  # A --switch target longer than 1023 bytes passed the check, then was cut to 1023 bytes.
  pad=$(printf '%*s' 3000 '')
  out=$("${run[@]}" --data "$tmp/text.txt" --steps 4 --dp 2 --switch "2:{\"dp\": 1,$pad \"tp\": 2}" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] && grep -q "switched dp2 x tp1 -> dp1 x tp2" <<<"$out"; then
    echo "ok   a 3 KB --switch target is carried out whole"; pass=$((pass + 1))
  else
    echo "FAIL a 3 KB --switch target (exit $rc)"; echo "$out" | tail -3; fail=$((fail + 1))
  fi
  # Divergence was silent (NaN gradient norms from step 20, exit 0).
  tiny="$(dirname "$0")/../configs/gpt-tiny.json"
  expect "divergence stops the run" "training diverged; lower --lr" "$bin" train --model "$tiny" \
    --data "$tmp/text.txt" --lr 10 --steps 60 --batch 4 --seq 32
  out=$("$bin" train --model "$tiny" --data "$tmp/text.txt" --lr 10 --steps 60 --batch 4 --seq 32 \
    --on-nan skip --log-every 1 --log-jsonl "$tmp/skip.jsonl" 2>&1)
  rc=$?
  # The log stays JSON: a non-finite loss or norm is null (printf's nan is not JSON).
  if [ "$rc" -eq 0 ] && grep -q "skipped: not finite" <<<"$out" && grep -q '"skipped": true' \
    "$tmp/skip.jsonl" && ! grep -qi 'nan' "$tmp/skip.jsonl"; then
    echo "ok   --on-nan skip goes on, marks the skipped steps, and logs null for NaN"
    pass=$((pass + 1))
  else
    echo "FAIL --on-nan skip (exit $rc)"; echo "$out" | tail -3; fail=$((fail + 1))
  fi
  finish
  exit
fi

expect "n_embd not divisible by n_head" "not divisible" "$bin" train --model "$tmp/bad-div.json" --data "$tmp/text.txt"
expect "config JSON path" '$.n_head' "$bin" train --model "$tmp/bad-type.json" --data "$tmp/text.txt"
expect "malformed config" "malformed" "$bin" train --model "$tmp/truncated.json" --data "$tmp/text.txt"
expect "missing config" "missing.json" "$bin" train --model "$tmp/missing.json" --data "$tmp/text.txt"
expect "tp does not divide heads" "does not divide" "${run[@]}" --data "$tmp/text.txt" --tp 3
expect "missing data" "nothere.txt" "${run[@]}" --data "$tmp/nothere.txt"
# --device cuda fails at once with the CUDA runtime's reason (this check runs without a GPU);
# auto falls back and says why.
expect "--device cuda" "--device cuda: " "${run[@]}" --data "$tmp/text.txt" --device cuda
expect "--device unknown" "tpu" "${run[@]}" --data "$tmp/text.txt" --device tpu
out=$("${run[@]}" --data "$tmp/text.txt" --device auto 2>&1)
rc=$?
if [ "$rc" -eq 0 ] && grep -q "^device auto: .*; training on the CPU" <<<"$out"; then
  echo "ok   --device auto: $(grep '^device auto' <<<"$out")"
  pass=$((pass + 1))
else
  echo "FAIL --device auto (exit $rc)"; echo "$out" | head -3; fail=$((fail + 1))
fi
expect "empty data" "empty" "${run[@]}" --data "$tmp/empty.txt"
expect "short data" "short.txt" "${run[@]}" --data "$tmp/short.txt"
expect "strategy JSON path" '$.mesh.tp' "${run[@]}" --data "$tmp/text.txt" --strategy "$tmp/bad-strategy.json"
expect "placements no rule accepts" "S(7)" "${run[@]}" --data "$tmp/text.txt" --strategy "$tmp/bad-placement.json"
expect "ZeRO with dp 1" "ZeRO shards over data parallelism: give dp >= 2 or zero 0" "${run[@]}" \
  --data "$tmp/text.txt" --strategy "$tmp/zero-dp1.json"
expect "ZeRO stage 4" "0..3" "${run[@]}" --data "$tmp/text.txt" --strategy "$tmp/zero4.json"
expect "negative bucket" "\$.bucket_mb: expected a bucket size in MiB (0 to 1048576; 0: none), got -1" "${run[@]}" \
  --data "$tmp/text.txt" --strategy "$tmp/bucket-neg.json"
expect "ZeRO flag with dp 1" "give dp >= 2 or zero 0" "${run[@]}" --data "$tmp/text.txt" --zero 2
expect "ZeRO flag stage 4" "bad value '4' for --zero" "${run[@]}" --data "$tmp/text.txt" --zero 4
expect "recompute flag mode" 'a recompute mode: "none", "full" or "selective"' "${run[@]}" --data "$tmp/text.txt" \
  --recompute some
expect "negative bucket" "bad value '-1' for --bucket-mb" "${run[@]}" --data "$tmp/text.txt" \
  --bucket-mb -1
expect "sp without tp" "--sp" "${run[@]}" --data "$tmp/text.txt" --sp
expect "unknown flag" "unknown option" "${run[@]}" --data "$tmp/text.txt" --frobnicate 3
expect "bad number" "bad value" "${run[@]}" --data "$tmp/text.txt" --steps lots
expect "batch not divisible by dp" "not divisible by dp" "${run[@]}" --data "$tmp/text.txt" --batch 3 --dp 2

# Pipelines: explain draws the schedule, then the chunk programs (exit 0); bad pipeline input is
# refused in one line that names the fix.
cat >"$tmp/four.json" <<'J'
{"n_layer": 4, "n_head": 4, "n_embd": 32, "vocab_size": 256, "n_positions": 32}
J
pipe=("$bin" explain --model "$tmp/four.json" --batch 8 --seq 16)
out=$("${pipe[@]}" --pp 2 --micro-batches 2 2>&1)
rc=$?
drawn=$(grep -n "^stage 1  .  F0 B0 B0 F1 B1 B1 .  .$" <<<"$out" | cut -d: -f1)
program=$(grep -n "^strategy dp1 x tp1 x pp2 m2" <<<"$out" | cut -d: -f1)
if [ "$rc" -eq 0 ] && grep -q "^pipeline schedule: 1f1b, pp 2, 2 micro-batches" <<<"$out" &&
  grep -q "formula (p-1)/(m+p-1) = 1/3 = 33.3%" <<<"$out" && [ -n "$drawn" ] && [ -n "$program" ] &&
  [ "$drawn" -lt "$program" ]; then
  echo "ok   explain --pp draws the schedule, then the program (exit 0)"
  pass=$((pass + 1))
else
  echo "FAIL explain --pp (exit $rc):"; echo "$out" | head -12; fail=$((fail + 1))
fi
out=$("${pipe[@]}" --pp 2 --micro-batches 4 --schedule zb-h1 2>&1)
if grep -q "^stage 0  F0 F1 .  B0 W0 F2 B1 W1 F3 B2 W2 B3 W3$" <<<"$out"; then
  echo "ok   explain --schedule zb-h1 draws W"; pass=$((pass + 1))
else
  echo "FAIL explain --schedule zb-h1:"; echo "$out" | head -8; fail=$((fail + 1))
fi
expect_rc_pipe() { # NAME WANTED-TEXT FLAGS...: exit 2, the text in the output
  local name=$1 want=$2
  shift 2
  expect "$name" "$want" "${pipe[@]}" "$@"
  "${pipe[@]}" "$@" >/dev/null 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL $name exits $rc, not 2"; fail=$((fail + 1)); }
}
expect_rc_pipe "unknown schedule" "bad value 'zigzag' for --schedule: a pipeline schedule: \"1f1b\", \"gpipe\", \"interleaved\" or \"zb-h1\"" \
  --pp 2 --schedule zigzag
expect_rc_pipe "virtual stages splitting layers" "cannot be cut into 3 chunks; use virtual_stages 2" \
  --pp 2 --micro-batches 2 --schedule interleaved --virtual-stages 3
expect_rc_pipe "interleaved micro-batches" \
  "needs the micro-batches (3) to be a multiple of pp 2; use 2 or 4 micro-batches" --pp 2 \
  --micro-batches 3 --batch 6 --schedule interleaved --virtual-stages 2
expect_rc_pipe "interleaved without virtual stages" "takes 2 or more virtual stages" --pp 2 \
  --micro-batches 2 --schedule interleaved
expect_rc_pipe "pp above the layers" "pp 8 exceeds the 4 layers: every stage needs at least one layer" \
  --pp 8
expect_rc_pipe "micro-batches not dividing the batch" \
  "3 micro-batches do not make the 8 sequences per dp rank (batch 8 / dp 1); give micro_batches" \
  --pp 2 --micro-batches 3

# A checkpoint whose shapes do not match the model.
"${run[@]}" --data "$tmp/text.txt" --save "$tmp/ck.safetensors" >/dev/null 2>&1
cat >"$tmp/wide.json" <<'J'
{"n_layer": 1, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 32}
J
expect "checkpoint shape mismatch" "the model expects" "$bin" eval --model "$tmp/wide.json" \
  --checkpoint "$tmp/ck.safetensors" --data "$tmp/text.txt" --batch 2 --seq 16 --batches 1
printf 'garbage' >"$tmp/bad.safetensors"
expect "corrupt checkpoint" "bad.safetensors" "$bin" eval --model "$tmp/ok.json" \
  --checkpoint "$tmp/bad.safetensors" --data "$tmp/text.txt" --batch 2 --seq 16 --batches 1
expect "eval with offload" "eval has no optimizer: leave --offload out" "$bin" eval \
  --model "$tmp/ok.json" --checkpoint "$tmp/ck.safetensors" --data "$tmp/text.txt" --offload
expect "offload-serial without offload" "add --offload" "${run[@]}" --data "$tmp/text.txt" \
  --offload-serial
expect "replicated head without tp" "needs tp 2 or more" "${run[@]}" --data "$tmp/text.txt" \
  --head-replicated
expect "offload not a bool" "offload" "${run[@]}" --data "$tmp/text.txt" --switch '1:{"dp": 1, "offload": 2}'
plan=("$bin" plan --model "$tmp/ok.json" --cluster dgx-a100-80gb --devices 8 --global-batch 8 --seq 16)
expect "plan without a model" "--model CONFIG.json is required" "$bin" plan --cluster h100 --devices 8 --global-batch 8 --seq 16
expect "plan unknown cluster" "unknown cluster 'dgx-z9'" "$bin" plan --model "$tmp/ok.json" --cluster dgx-z9 --devices 8 --global-batch 8 --seq 16
expect "plan bad knob" "unknown setting 'tq'; did you mean 'tp'" "${plan[@]}" --evaluate "tq=2"
expect "plan impossible knob" "does not divide the 4 attention heads" "${plan[@]}" --evaluate "tp=8"
expect "plan bad number" "bad value '0' for --devices" "${plan[@]}" --devices 0
expect "plan sequence too long" "exceeds the model's n_positions" "${plan[@]}" --seq 64
expect "plan bad dtype" "use bf16 or fp32" "${plan[@]}" --dtype fp8
printf '{"hosts": 2, "ranks_per_host": 4}' >"$tmp/topo.json"
expect "plan topology without a link" "missing required key \$.inter_node" "${plan[@]}" --topology "$tmp/topo.json"
printf '{"hosts": 2, "ranks_per_host": 4, "rank_order": "zigzag", "inter_node": {"bw_gbps": 1}}' >"$tmp/topo.json"
expect "plan topology bad rank order" "is not one of by-host, round-robin" "${plan[@]}" --topology "$tmp/topo.json"
"${plan[@]}" --evaluate "tq=2" >/dev/null 2>&1
rc=$?
if [ "$rc" -eq 2 ]; then echo "ok   plan bad input exits 2"; pass=$((pass + 1)); else echo "FAIL plan bad input exits $rc, not 2"; fail=$((fail + 1)); fi
expect "unknown command" "unknown command" "$bin" frobnicate

# --- help and suggestions: one table per command (cli/options.h) ---

# expect_rc RC NAME WANTED-TEXT COMMAND...: exit code exactly RC, the text in the output.
expect_rc() {
  local want_rc=$1 name=$2 want=$3
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want_rc" ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name (exit $rc, wanted $want_rc): wanted '$want' in:"
    echo "$out" | head -5
    fail=$((fail + 1))
  else
    pass=$((pass + 1))
  fi
}

# help_lists "CMD WORDS" FLAG...: `meshscope CMD --help` and `-h` exit 0 and name every flag,
# each on a line of its own.
help_lists() {
  local -a cmd
  read -ra cmd <<<"$1"
  shift
  local flag h out rc missing
  for h in --help -h; do
    out=$("$bin" "${cmd[@]}" "$h" 2>&1)
    rc=$?
    missing=""
    for flag in "$@"; do
      grep -qE -- "^ +(-[a-z], )?$flag( |,|$)" <<<"$out" || missing="$missing $flag"
    done
    if [ "$rc" -ne 0 ] || [ -n "$missing" ] || ! grep -q "^usage: meshscope ${cmd[*]}" <<<"$out"; then
      echo "FAIL ${cmd[*]} $h (exit $rc), not listed:${missing:- (usage line)}"
      echo "$out" | head -5
      fail=$((fail + 1))
    else
      pass=$((pass + 1))
    fi
  done
  echo "ok   ${cmd[*]} --help and -h list $# flags"
}

help_lists "train" --model --data --strategy --dp --tp --pp --cp --sp --head-replicated --micro-batch --pp-layers --precision \
  --micro-batches --schedule \
  --virtual-stages --zero --recompute --bucket-mb --backend --steps --seed --batch \
  --seq --lr --min-lr --warmup --weight-decay --clip --log-jsonl --save --sample --log-every \
  --eval-every --val-fraction --threads --trace --trace-from --web --web-token-file --tui \
  --switch --advise-threshold --memory-cap --offload --offload-serial --help
help_lists "eval" --model --checkpoint --data --batch --seq --batches --dp --tp --pp --cp --sp \
  --micro-batches --schedule --virtual-stages --zero --recompute --bucket-mb --strategy --backend \
  --help
help_lists "explain" --model --strategy --dp --tp --pp --cp --sp --head-replicated \
  --micro-batches --schedule \
  --virtual-stages --zero --recompute --bucket-mb --batch --seq --backend --help
help_lists "demo" --ranks --backend --help
help_lists "bench comm" --json --ranks --min-bytes --max-bytes --step --iters --reps --ops \
  --backends --quick --mpi-default-malloc --help
help_lists "bench gemm" --m --n --k --ta --tb --backward --threads --iters --reps --json --help
help_lists "trace merge" --output --help
help_lists "trace summary" --steps --help
help_lists "trace check" --help
help_lists "serve" --web --web-token-file --help
help_lists "top" --token-file --token --interval --read-only --help
help_lists "plan" --model --cluster --devices --global-batch --seq --dtype --evaluate --top \
  --executable-only --json --recalibrate --help
expect_rc 0 "meshscope --help lists commands" "bench gemm" "$bin" --help
for c in train eval explain demo "bench comm" "trace" serve top plan; do
  expect_rc 0 "meshscope --help lists $c" "  $c" "$bin" --help
done
expect_rc 0 "meshscope --version" "meshscope 0." "$bin" --version
expect_rc 0 "trace --help lists its commands" "summary FILE.json" "$bin" trace --help
expect_rc 0 "bench --help lists the benchmarks" "comm|gemm" "$bin" bench --help

# suggest NAME "CMD WORDS" TYPO WANTED: exit 2 with "did you mean 'WANTED'?".
suggest() {
  local -a cmd
  read -ra cmd <<<"$1"
  expect_rc 2 "${cmd[*]} $2" "unknown option '$2'; did you mean '$3'?" "$bin" "${cmd[@]}" "$2" x
}
suggest "train" --step --steps
suggest "train" --wramup --warmup
suggest "train" -steps --steps
suggest "eval" --checkpiont --checkpoint
suggest "explain" --stratgy --strategy
suggest "demo" --rank --ranks
suggest "bench comm" --max-byte --max-bytes
suggest "bench gemm" --thread --threads
suggest "trace merge" --outptu --output
suggest "trace summary" --step --steps
suggest "trace check" --hlep --help
suggest "serve" --wbe --web
suggest "top" --intervl --interval
suggest "plan" --global-bach --global-batch
echo "ok   unknown flags: the closest suggested, exit 2"
expect_rc 2 "no suggestion far from every flag" "'meshscope train --help' lists the options" \
  "${run[@]}" --data "$tmp/text.txt" --frobnicate 3
expect_rc 2 "missing value names the flag" "--steps needs a value" "${run[@]}" --steps
expect_rc 2 "bad value names flag and range" "bad value 'lots' for --steps: expected an integer from 0" \
  "${run[@]}" --data "$tmp/text.txt" --steps lots
expect_rc 2 "bad choice names the choices" "bad value 'nccl' for --backend: use threads or mpi" \
  "${run[@]}" --data "$tmp/text.txt" --backend nccl
expect_rc 2 "flag that takes no value" "--sp takes no value" "${run[@]}" --sp=1
expect_rc 2 "top: bad interval" "bad value '10' for --interval: expected an integer from 50 to 60000" \
  "$bin" top http://127.0.0.1:1/ --interval 10
expect_rc 2 "serve: one file" "unexpected argument 'b.json'" "$bin" serve a.json b.json
expect_rc 2 "bench comm: bad list" "bad value 'all_sum' for --ops" "$bin" bench comm --ops all_sum
echo "ok   errors name the flag and exit 2"

# ops: the table as JSON, one object per operator with a name and its rules.
ops_json=$("$bin" ops --json)
n_ops=$(grep -c '"name":' <<<"$ops_json")
n_rules=$(grep -c '"rules":' <<<"$ops_json")
if [ "$n_ops" -ge 18 ] && [ "$n_ops" -eq "$n_rules" ] && "$bin" ops | head -1 | grep -q "^$n_ops operators"; then
  echo "ok   ops --json: $n_ops operators, each with its rules; ops prints the count"
  pass=$((pass + 1))
else
  echo "FAIL ops: $n_ops names, $n_rules rule lists"
  fail=$((fail + 1))
fi
# ops: every operator lists the devices it runs on, and none runs on the host only.
n_fenced=$(tr -d ' \t\n' <<<"$ops_json" | grep -o '"devices":\[[^]]*\]' | grep -c '"fenced"')
if [ "$n_fenced" -eq "$n_ops" ] && "$bin" ops | head -1 | grep -q "; 0 run on the host only$"; then
  echo "ok   ops: all $n_ops operators run on the fenced device; none on the host only"
  pass=$((pass + 1))
else
  echo "FAIL ops devices: $n_fenced of $n_ops operators run on the fenced device"
  fail=$((fail + 1))
fi
# ops: operators whose attributes no probe guesses show their rules at an example, described.
ops_text=$("$bin" ops)
if grep -q "^max_pool2d .*(i = kernel 3, 3, stride 2, 2, padding 1, 1)" <<<"$ops_text" &&
  grep -A3 "^group_norm " <<<"$ops_text" | grep -q "S(1), S(0), S(0) -> S(1)"; then
  echo "ok   ops: pooling and group_norm shown at example attributes, with their rules"
  pass=$((pass + 1))
else
  echo "FAIL ops: no example attributes for max_pool2d or no channel rule for group_norm"
  fail=$((fail + 1))
fi
expect_rc 2 "checkpoint export needs -o" "give the checkpoint and the output" \
  "$bin" checkpoint export "$tmp"
expect_rc 1 "checkpoint info: not a checkpoint" "no checkpoint in" "$bin" checkpoint info "$tmp"
expect_rc 2 "train: --save-every alone" "need --save-dir" \
  "${run[@]}" --data "$tmp/text.txt" --save-every 2

finish
