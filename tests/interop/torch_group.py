"""A torch.distributed gloo rank for dgrad's sub-group interop test (run by
/usr/bin/python3 with Debian's torch 1.13): the sequence of dg_group.c.
World of 4; every rank calls new_group for each of GROUPS in order (members
or not, as torch requires); members run an allreduce of three sizes, a
broadcast from the group's last rank, an allgather and a barrier on it and
check every value; then the world runs one more allreduce."""
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

GROUPS = [[0, 1], [2, 3], [1, 3], [0, 2], [0, 1, 3]]


def vals(q, n):
    return (q + 1) * torch.remainder(torch.arange(n, dtype=torch.float64), 1000) / 8.0


def check_group(r, ranks, g):
    for n in (1, 1000, 100001):
        t = vals(r, n).float()
        dist.all_reduce(t, group=g)
        want = sum(vals(q, n) for q in ranks).float()
        if not torch.equal(t, want):
            print(f"torch rank {r}: group {ranks}: allreduce of {n} wrong: {t[:4]}", flush=True)
            return False
    root = ranks[-1]  # a global rank, as torch's broadcast takes it
    b = torch.full((777,), 10.0 * root + 0.5) if r == root else torch.zeros(777)
    dist.broadcast(b, root, group=g)
    if not torch.equal(b, torch.full((777,), 10.0 * root + 0.5)):
        print(f"torch rank {r}: group {ranks}: broadcast wrong", flush=True)
        return False
    outs = [torch.zeros(3) for _ in ranks]
    dist.all_gather(outs, torch.tensor([r, 2.0 * r, 3.0 * r]), group=g)
    for q, o in zip(ranks, outs):
        if not torch.equal(o, torch.tensor([q, 2.0 * q, 3.0 * q])):
            print(f"torch rank {r}: group {ranks}: allgather wrong: {outs}", flush=True)
            return False
    dist.barrier(group=g)
    return True


def main():
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    r = dist.get_rank()
    groups = [dist.new_group(ranks) for ranks in GROUPS]
    for ranks, g in zip(GROUPS, groups):
        if r in ranks and not check_group(r, ranks, g):
            return 1
    t = torch.full((5,), float(r))
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((5,), 6.0)):
        print(f"torch rank {r}: world allreduce wrong: {t}", flush=True)
        return 1
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
