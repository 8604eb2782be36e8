"""A torch.distributed gloo rank for dgrad's interop tests (run by
/usr/bin/python3 with Debian's torch 1.13). Same sequence as dg_rank.c:
allreduces of 0, 1, 5 and 1,000,001 floats, a broadcast, a barrier and one
more allreduce; checks every value and writes the raw result bytes to
argv[1] so the driver can compare ranks byte for byte."""
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def expected_sum(world, n, f):
    i = torch.arange(n, dtype=torch.float64)
    return sum(f(r, i) for r in range(world)).float()


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    r, w = dist.get_rank(), dist.get_world_size()
    fs = [lambda q, i: q + 1 + 0 * i,
          lambda q, i: q * i + 0.5,
          lambda q, i: (q + 1) * torch.remainder(i, 1000) / 8.0]
    results = []
    for n, f in [(0, fs[0]), (1, fs[0]), (5, fs[1]), (1000001, fs[2])]:
        t = f(r, torch.arange(n, dtype=torch.float64)).float()
        dist.all_reduce(t)
        if not torch.equal(t, expected_sum(w, n, f)):
            print(f"torch rank {r}: allreduce of {n} wrong: {t[:5]}", flush=True)
            return 1
        results.append(t)
    root = w - 1
    b = (torch.arange(1000, dtype=torch.float32) * 2 + 0.25) if r == root else torch.zeros(1000)
    dist.broadcast(b, root)
    if not torch.equal(b, torch.arange(1000, dtype=torch.float32) * 2 + 0.25):
        print(f"torch rank {r}: broadcast wrong", flush=True)
        return 1
    results.append(b)
    dist.barrier()
    t = fs[1](r, torch.arange(5, dtype=torch.float64)).float()
    dist.all_reduce(t)
    if not torch.equal(t, expected_sum(w, 5, fs[1])):
        print(f"torch rank {r}: last allreduce wrong", flush=True)
        return 1
    results.append(t)
    with open(out, "wb") as fh:
        fh.write(b"".join(x.numpy().tobytes() for x in results))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
