#!/usr/bin/python3
"""PyTorch counterpart of bench/mlp.c: the same MLP step, the same JSON line.

MLP 784-512-256-10, ReLU, cross-entropy, SGD lr 0.01 (torch.optim.SGD, no
momentum). One step = zero_grad + forward + backward + optimizer step, on a
fixed random batch with fixed random labels.

    /usr/bin/python3 bench/mlp_torch.py [--batch N] [--threads T] [--steps S] [--warmup W]
                                        [--max-seconds X] [--blas-threads B]

--max-seconds stops the timed loop early once X seconds have passed (the line
then reports the steps actually run), as bench/mlp.c does.

Run with /usr/bin/python3 (Debian's python3-torch 1.13). OMP_WAIT_POLICY is
read from the environment (it must be set before torch starts) and reported.
heap_allocs_per_step is not measured for torch (null). cpu_ms_per_step is the
process's CPU time (all threads) over the timed steps, as in bench/mlp.c.

Threads: --threads T means T compute threads (torch_setup.py sets
OPENBLAS_NUM_THREADS too); reported as "blas_threads".
"""
import argparse

from torch_setup import add_thread_args, import_torch, report, time_steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=0)
    add_thread_args(ap)
    a = ap.parse_args()
    torch, nn, blas = import_torch(a, "mlp_torch.py")
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(),
                          nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(42)
    x = torch.randn(a.batch, 784, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g, dtype=torch.int64)

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    done, wall, cpu, loss = time_steps(step, a.warmup, a.steps, a.max_seconds)
    report(a, blas, done, wall, cpu, loss)

if __name__ == "__main__":
    main()
