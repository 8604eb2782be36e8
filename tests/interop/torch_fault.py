"""A torch.distributed gloo rank for dgrad's fault and misuse interop tests
(fault_driver.c; /usr/bin/python3 with Debian's torch 1.13).

  torch_fault.py loop DIR   all-reduces in a loop until something fails
                            (writes DIR/ready_<rank> once joined)
  torch_fault.py once DIR   one all-reduce and a barrier, then leaves
  torch_fault.py store PORT a TCPStore client of a dgrad server: keys with
                            NUL bytes and the empty key, set, get, check, wait
"""
import os
import sys
from datetime import timedelta


def loop(d, once):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.ones(4096)
    dist.all_reduce(t)
    open(os.path.join(d, "ready_%d" % r), "w").close()
    if once:
        t = torch.ones(5)
        dist.all_reduce(t)
        ok = torch.equal(t, torch.full((5,), float(w)))
        dist.barrier()
        dist.destroy_process_group()
        return 0 if ok else 1
    while True:
        t = torch.ones(4096)
        dist.all_reduce(t)


def store(port):
    import torch.distributed as dist
    s = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=20))
    keys = {"a\0b": b"v1", "a\0c": b"v2", "": b"empty", "\0": b"nul"}
    for k, v in keys.items():
        s.set(k, v)
    for k, v in keys.items():
        s.wait([k], timedelta(seconds=10))
        got = s.get(k)
        if got != v:
            print("torch store client: key %r: got %r, want %r" % (k, got, v), flush=True)
            return 1
    if s.num_keys() < len(keys):
        print("torch store client: %d keys, want at least %d" % (s.num_keys(), len(keys)),
              flush=True)
        return 1
    s.set("done", b"1")
    return 0


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "store":
        sys.exit(store(int(sys.argv[2])))
    sys.exit(loop(sys.argv[2], mode == "once"))
