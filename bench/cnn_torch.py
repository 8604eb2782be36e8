#!/usr/bin/python3
"""PyTorch counterpart of bench/cnn.c: the same CNN step, the same JSON line.

The examples/mnist CNN: conv 1->32 3x3 pad 1, ReLU, maxpool 2, conv 32->64
3x3 pad 1, ReLU, maxpool 2, flatten, linear 3136->128, ReLU, linear 128->10,
on (B, 1, 28, 28) inputs; cross-entropy, SGD lr 0.01 (torch.optim.SGD, no
momentum). One step = zero_grad + forward + backward + optimizer step, on a
fixed random batch with fixed random labels.

    /usr/bin/python3 bench/cnn_torch.py [--batch N] [--threads T] [--steps S] [--warmup W]

Run with /usr/bin/python3 (Debian's python3-torch 1.13). OMP_WAIT_POLICY is
read from the environment (it must be set before torch starts) and reported.
heap_allocs_per_step is not measured for torch (null).

Threads. Debian's torch does its GEMMs in OpenBLAS (BLAS_INFO=generic), and
torch.set_num_threads() does not reach OpenBLAS's own pool, which starts one
thread per core. So that --threads T means T compute threads, this script sets
OPENBLAS_NUM_THREADS=T before torch loads (--blas-threads overrides it; 0
leaves OpenBLAS at its default, i.e. what a plain `import torch` gets) and
reports it as "blas_threads".
"""
import argparse
import json
import os
import resource
import time

from torch_setup import add_thread_args, import_torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    add_thread_args(ap)
    a = ap.parse_args()
    torch, nn, blas = import_torch(a, "cnn_torch.py")
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(42)
    x = torch.randn(a.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g, dtype=torch.int64)

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = time.perf_counter() - t0

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({
        "impl": "torch", "model": "cnn", "batch": a.batch, "threads": a.threads, "steps": a.steps,
        "steps_per_s": round(a.steps / dt, 3), "peak_rss_mib": round(rss, 1),
        "heap_allocs_per_step": None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "blas_threads": blas,
        "loss": round(float(loss), 5),
    }), flush=True)


if __name__ == "__main__":
    main()
