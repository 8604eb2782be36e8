#!/usr/bin/python3
"""PyTorch counterpart of bench/ddp/ddp_mlp.c: the MLP 784-512-256-10 (ReLU,
cross-entropy, SGD lr 0.01) on W local ranks under torch DDP with the gloo
backend, batch B per rank, T threads per rank; prints the same JSON line.

    /usr/bin/python3 bench/ddp/ddp_mlp_torch.py [--nproc W] [--ddp 0|1]
        [--batch B] [--threads T] [--steps S] [--warmup N] [--bucket-mib X]

Run with /usr/bin/python3 (Debian's python3-torch 1.13). OPENBLAS_NUM_THREADS
is set to T before torch loads (see bench/mlp_torch.py for why).
--ddp 0 (W = 1): the plain single-process loop, no process group.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from host import free_port  # noqa: E402  (below the ephemeral range: bench/host.py)


def rank_main(rank, a, port):
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    import torch
    import torch.nn as nn
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    if a.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                                rank=rank, world_size=a.nproc)
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mib)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(42 + rank)
    x = torch.randn(a.batch, 784, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g, dtype=torch.int64)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = (time.perf_counter() - t0) / a.steps
    if rank == 0:
        print(json.dumps({"impl": "torch", "bench": "ddp_mlp", "nproc": a.nproc, "ddp": a.ddp,
                          "batch": a.batch, "threads": a.threads, "steps": a.steps,
                          "bucket_mib": a.bucket_mib, "step_ms": round(dt * 1e3, 4),
                          "samples_per_s": round(a.nproc * a.batch / dt, 1),
                          "loss": round(loss, 5)}), flush=True)
    if a.ddp:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--ddp", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--bucket-mib", type=float, default=25)
    a = ap.parse_args()
    if not a.ddp and a.nproc != 1:
        ap.error("--ddp 0 needs --nproc 1")
    try:
        import importlib.util
        if importlib.util.find_spec("torch") is None:
            raise ImportError
    except ImportError:
        sys.stderr.write("ddp_mlp_torch.py: torch not found; run with /usr/bin/python3\n")
        sys.exit(77)
    port = free_port()
    pids = []
    for r in range(a.nproc):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                rank_main(r, a, port)
            except Exception as e:  # report and fail this rank
                sys.stderr.write("rank %d: %r\n" % (r, e))
                code = 1
            sys.stdout.flush()
            os._exit(code)
        pids.append(pid)
    bad = 0
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        bad |= st != 0
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
