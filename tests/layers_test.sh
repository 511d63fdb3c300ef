#!/usr/bin/env bash
# layers_test.sh SRC_DIR: the layer check passes on the tree, and fails, naming the file and
# the rule, on copies of it with an upward include, a sideways include (tui -> web), an
# include written from an old root, a folder no layer owns, a cycle between engine sub-layers
# and OpenBLAS reached outside its one door.
set -uo pipefail
src=${1:?usage: layers_test.sh SRC_DIR}
check="$src/scripts/check-layers.sh"
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

if out=$("$check" "$src" 2>&1); then ok "the tree follows the layer table"; else bad "the tree: $out"; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect_violation() { # name file line pattern
  local name=$1 file=$2 line=$3 pattern=$4
  rm -rf "$tmp/t" && mkdir -p "$tmp/t"
  (cd "$src" && cp -r --parents docs/ARCHITECTURE.md engine profiler traces tui web cli "$tmp/t/")
  [ -d "$src/job" ] && cp -r "$src/job" "$tmp/t/"
  mkdir -p "$(dirname "$tmp/t/$file")"
  echo "$line" >>"$tmp/t/$file"
  if out=$("$check" "$tmp/t" 2>&1); then
    bad "$name: the check passed"
  elif grep -q -- "$pattern" <<<"$out"; then
    ok "$name: $(head -1 <<<"$out")"
  else
    bad "$name: unexpected message: $out"
  fi
}
expect_violation "upward include" engine/dist/mesh.c '#include "profiler/live.h"' \
  "engine/dist/mesh.c:.*layer 'dist' includes \"profiler/live.h\" of layer 'profiler'"
expect_violation "engine includes a view" engine/graph/program.c '#include "web/web.h"' \
  "layer 'engine.graph' includes \"web/web.h\" of layer 'web'"
expect_violation "sideways include" tui/draw.c '#include "web/web.h"' \
  "layer 'tui' includes \"web/web.h\" of layer 'web'"
expect_violation "old include root" engine/graph/program.c '#include "core/status.h"' \
  'does not resolve from the include root'
expect_violation "unowned folder" engine/newlayer/x.c '/* empty */' \
  'engine/newlayer/x.c: no layer owns this folder'
# The engine emits through its own sink (engine/core/trace_sink.h), never the profiler's files.
expect_violation "engine includes the recorder" engine/graph/program.c \
  '#include "profiler/record/recorder.h"' \
  "layer 'engine.graph' includes \"profiler/record/recorder.h\" of layer 'record'"
# The engine's sub-layers: the three cycles they once had each fail now.
expect_violation "optim <-> kernels cycle" engine/optim/optim.c '#include "engine/kernels/kernels.h"' \
  "layer 'engine.optim' includes \"engine/kernels/kernels.h\" of layer 'engine.kernels'"
expect_violation "plan <-> train cycle" engine/plan/engine_workload.c '#include "engine/train/stages.h"' \
  "layer 'engine.plan' includes \"engine/train/stages.h\" of layer 'engine.train'"
expect_violation "runtime <-> dist cycle" engine/runtime/ctx.c '#include "engine/dist/reshard.h"' \
  "layer 'dist.runtime' includes \"engine/dist/reshard.h\" of layer 'dist'"
expect_violation "OpenBLAS outside its door" engine/kernels/norm.c '#include <cblas.h>' \
  'engine/kernels/norm.c:.*OpenBLAS used outside engine/kernels/blas.c'
expect_violation "BLAS threads set behind the policy" engine/ops/ops_layers.c \
  'static void f(void) { openblas_set_num_threads(2); }' 'OpenBLAS used outside engine/kernels/blas.c'

[ "$fail" -eq 0 ] && echo "layer check: all cases passed"
exit "$fail"
