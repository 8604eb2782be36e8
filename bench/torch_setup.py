"""Thread set-up and torch import shared by the PyTorch benchmark scripts.

Debian's torch does its GEMMs in OpenBLAS, whose own pool
torch.set_num_threads() does not reach, so --threads T also sets
OPENBLAS_NUM_THREADS=T before torch loads (--blas-threads overrides it; 0
leaves OpenBLAS at its default, what a plain `import torch` gets)."""
import os
import sys


def add_thread_args(ap):
    ap.add_argument("--blas-threads", type=int, default=-1,
                    help="OpenBLAS threads (-1: same as --threads; 0: OpenBLAS default)")


def import_torch(a, prog):
    """Sets the thread counts from a.threads / a.blas_threads, imports torch
    (exit 77 when absent), seeds it. Returns (torch, torch.nn, blas_threads),
    blas_threads being the number set or "default"."""
    blas = a.threads if a.blas_threads < 0 else a.blas_threads
    if blas > 0:
        os.environ["OPENBLAS_NUM_THREADS"] = str(blas)  # read when OpenBLAS loads
    else:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)
    try:
        import torch
        import torch.nn as nn
    except ImportError:
        sys.stderr.write("%s: torch not found; run with /usr/bin/python3 "
                         "(apt-get install python3-torch)\n" % prog)
        sys.exit(77)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    return torch, nn, (blas if blas > 0 else "default")
