"""Checks that dgrad's layers depend one way (docs/ARCHITECTURE.md).

Every source and header of the library belongs to one layer; a file may
include headers of its own layer and of lower layers only. An include that
runs the wrong way fails the check, unless it is listed in KNOWN below with
the reason it is still there; a KNOWN edge that no longer exists fails too,
so the list only shrinks. Exit status 1 on any failure.

Usage: python3 scripts/check_layers.py [repo root]
"""
import os
import re
import sys

# Lowest first. A path belongs to the first layer with a matching prefix.
LAYERS = [
    ("base", ["base/", "include/dgrad/common.h", "include/dgrad/trace.h"]),
    ("backends", ["backends/"]),
    ("core", ["core/", "include/dgrad/tensor.h"]),
    ("autograd", ["autograd/", "include/dgrad/autograd.h", "include/dgrad/swap.h"]),
    ("ops", ["ops/", "include/dgrad/ops.h"]),
    ("ckpt", ["ckpt/", "include/dgrad/checkpoint.h"]),
    ("nn", ["nn/", "include/dgrad/nn.h"]),
    ("optim", ["optim/", "include/dgrad/optim.h"]),
    ("data", ["data/", "include/dgrad/data.h"]),
    ("dist.net", ["dist/net/", "include/dgrad/store.h"]),
    ("dist.store", ["dist/store/"]),
    ("dist.transport", ["dist/transport/"]),
    # the process group in three: its runtime (works, queue, worker; the
    # group object and the header layers above see), the algorithms on it,
    # then the collectives API and creation ("dist/pg" after the others)
    ("dist.work", ["dist/pg_work", "dist/flight", "dist/pg_impl.h", "dist/pg_ext.h", "include/dgrad/dist.h"]),
    ("dist.coll", ["dist/coll_"]),
    ("dist.pg", ["dist/pg"]),
    ("dist.ddp", ["dist/ddp", "include/dgrad/ddp.h"]),
    # the pipeline over groups and (per stage) DDP
    ("dist.pipe", ["dist/pipe", "include/dgrad/pipe.h"]),
    # training as a service: stop agreed over a group, checkpoint directories
    ("run", ["run/", "include/dgrad/run.h"]),
    ("umbrella", ["include/dgrad.h"]),
]
# Dependency order, lowest first (checkpoints save modules, optimizers and
# data-loader positions, so they sit above all three).
ORDER = ["base", "backends", "core", "autograd", "ops", "nn", "optim", "data", "ckpt", "dist.net",
         "dist.store", "dist.transport", "dist.work", "dist.coll", "dist.pg", "dist.ddp",
         "dist.pipe", "run", "umbrella"]

# Wrong-way edges still in the code: (from file, included header) -> why.
# The architecture issue removes them; each removal deletes its line here.
KNOWN = {
    ("core/core_impl.h", "dgrad/autograd.h"):
        "the tape (dg_node, hooks) is declared in the core's impl header",
    ("core/core_impl.h", "dgrad/ops.h"):
        "the core impl header pulls in every op declaration",
}

# Backend kernel headers: only the backend's own files include them (ops
# and optimizers reach kernels through the backend interface).
PRIVATE = {"backends/cpu/cpu_impl.h": "backends/cpu/"}
KNOWN_PRIVATE = {
}

# Edges the order allows but the design does not: (files starting with, headers
# starting with, why). DDP sits above the transports but reaches them, and the
# group's internals, only through the group's interface for the layers above.
FORBIDDEN = [
    ("dist/ddp", "dist/transport/",
     "DDP does not call transports: it goes through the process group (dist/pg_ext.h)"),
    ("dist/ddp", ("dist/pg_impl.h", "dist/pg_work.h", "dist/coll_impl.h"),
     "DDP sees the process group through dist/pg_ext.h only (no transport types)"),
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    for name, prefixes in LAYERS:
        for p in prefixes:
            if path.startswith(p):
                return name
    return None


def sources(root):
    for top in ("base", "backends", "core", "autograd", "ops", "nn", "optim", "ckpt", "data", "dist", "include"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".c", ".h")):
                    full = os.path.join(dirpath, f)
                    yield os.path.relpath(full, root)


def resolve(root, src, inc):
    """Repo-relative path of an included header, or None (system/generated)."""
    for base in (root, os.path.join(root, "include"), os.path.dirname(os.path.join(root, src))):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.exists(cand):
            return os.path.relpath(cand, root)
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    rank = {name: i for i, name in enumerate(ORDER)}
    bad, seen_known, unassigned = [], set(), []
    for src in sorted(sources(root)):
        ls = layer_of(src)
        if ls is None:
            unassigned.append(src)
            continue
        text = open(os.path.join(root, src), encoding="utf-8", errors="replace").read()
        for inc in INCLUDE.findall(text):
            dst = resolve(root, src, inc)
            if dst is None:
                continue
            owner = PRIVATE.get(dst)
            if owner and not src.startswith(owner):
                if (src, inc) in KNOWN_PRIVATE:
                    seen_known.add((src, inc))
                else:
                    bad.append(f"{src} includes {inc}: a backend's kernel header, private "
                               f"to {owner}")
            for src_pre, dst_pre, why in FORBIDDEN:
                if src.startswith(src_pre) and dst.startswith(dst_pre):
                    bad.append(f"{src} includes {inc}: {why}")
            ld = layer_of(dst)
            if ld is None or rank[ld] <= rank[ls]:
                continue
            key = (src, inc)
            if key in KNOWN:
                seen_known.add(key)
                continue
            bad.append(f"{src} ({ls}) includes {inc} ({ld}): a lower layer may not "
                       f"depend on a higher one")
    for key in list(KNOWN) + list(KNOWN_PRIVATE):
        if key not in seen_known:
            bad.append(f"KNOWN edge {key[0]} -> {key[1]} no longer exists: delete it from "
                       f"scripts/check_layers.py")
    for src in unassigned:
        bad.append(f"{src}: belongs to no layer (add it to LAYERS in scripts/check_layers.py)")
    for line in bad:
        print("layers:", line)
    print(f"layers: {len(ORDER)} layers, {len(KNOWN) + len(KNOWN_PRIVATE)} known wrong-way edges, "
          f"{len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
