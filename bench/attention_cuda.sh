#!/usr/bin/env bash
# attention_cuda.sh - bf16 causal attention, forward and backward, on one GPU: meshscope's
# tensor-core flash kernels and its row kernels (bench_attention_cuda), and PyTorch's
# scaled_dot_product_attention (its flash backend) at the same shape, in one run; prints each
# side's time and TFLOP/s and the ratio meshscope / PyTorch (above 1: meshscope is faster).
#
#   bench/attention_cuda.sh [--bin BUILD/bench_attention_cuda] [--b 8] [--t 1024] [--c 768]
#                           [--nh 12] [--reps 5]
#
# The PyTorch side needs python3 with torch built for CUDA; without it that side is skipped
# and said so. Exits 77 when no GPU is usable.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
bin="$here/../build/bench_attention_cuda" b=8 t=1024 c=768 nh=12 reps=5
parse_opts attention_cuda.sh "$@"

out=$("$bin" --b "$b" --t "$t" --c "$c" --nh "$nh" --reps "$reps")
rc=$?
echo "$out" | grep -v '^meshscope_ms '
[ "$rc" -eq 0 ] || exit "$rc"
ms=$(echo "$out" | sed -n 's/^meshscope_ms //p')

python3 - "$b" "$t" "$c" "$nh" "$reps" "$ms" <<'PY'
import statistics, sys, time
b, t, c, nh, reps = (int(x) for x in sys.argv[1:6])
ms = float(sys.argv[6])
try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"  PyTorch: skipped ({e})")
    sys.exit(0)
if not torch.cuda.is_available():
    print("  PyTorch: skipped (torch sees no CUDA device)")
    sys.exit(0)
hs = c // nh
g = torch.Generator(device="cuda").manual_seed(1)
def rnd(*shape):
    return (torch.rand(*shape, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
# [B, T, 3C] as GPT-2 packs it, viewed as [B, NH, T, HS] per q, k, v
qkv = rnd(b, t, 3 * c).requires_grad_(True)
dout = rnd(b, nh, t, hs)
def call():
    q, k, v = (x.view(b, t, nh, hs).transpose(1, 2) for x in qkv.split(c, dim=2))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    o.backward(dout)
def timed(n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n
with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
    timed(3)
    n = 1
    while timed(n) * n < 0.1 and n < 1 << 16:
        n *= 2
    sec = statistics.median(timed(n) for _ in range(reps))
flops = 3.5 * 4.0 * b * nh * t * t / 2 * hs
print(f"  {'PyTorch ' + torch.__version__ + ' SDPA (flash)':32s} {sec * 1e3:9.3f} ms  "
      f"{flops / sec * 1e-12:7.1f} TFLOP/s")
print(f"  meshscope flash / PyTorch: {sec * 1e3 / ms:.3f}")
PY
