"""torch.distributed gloo counterpart of bench_allreduce.c (run with
/usr/bin/python3, Debian's torch 1.13): same sizes, warm-up, barrier before
each timed f32 allreduce, one JSON line per size from rank 0."""
import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    iters, sizes = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
    buf = torch.zeros((64 << 20) // 4)
    for nbytes in sizes:
        t = buf[: nbytes // 4]
        samples = []
        for i in range(-2, iters):
            t[::1024] = 1.0
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if i >= 0:
                samples.append((time.perf_counter() - t0) * 1e6)
        if dist.get_rank() == 0:
            print(json.dumps({"impl": "torch", "algo": "gloo", "world": dist.get_world_size(),
                              "bytes": nbytes, "us": [round(s, 1) for s in samples]}),
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
