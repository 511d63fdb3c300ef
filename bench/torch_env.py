"""torch_env.py - what the PyTorch sides of bench/train_vs_torch.sh report about their process."""

import os


def blas_libraries():
    """The BLAS/OpenMP shared objects this process has mapped (which sgemm torch used)."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                name = os.path.basename(line.split()[-1]) if "/" in line else ""
                if any(s in name for s in ("blas", "mkl", "dnnl", "gomp")):
                    libs.add(name)
    except OSError:
        pass
    return sorted(libs)
