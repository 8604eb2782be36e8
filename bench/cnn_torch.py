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

Threads: --threads T means T compute threads (torch_setup.py sets
OPENBLAS_NUM_THREADS too); reported as "blas_threads".
"""
import argparse

from torch_setup import add_thread_args, import_torch, report, time_steps


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

    done, wall, cpu, loss = time_steps(step, a.warmup, a.steps)
    report(a, blas, done, wall, cpu, loss, model="cnn")

if __name__ == "__main__":
    main()
