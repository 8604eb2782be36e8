"""Thread set-up, torch import, timed loop and JSON line shared by the
PyTorch benchmark scripts.

Debian's torch does its GEMMs in OpenBLAS, whose own pool
torch.set_num_threads() does not reach, so --threads T also sets
OPENBLAS_NUM_THREADS=T before torch loads (--blas-threads overrides it; 0
leaves OpenBLAS at its default, what a plain `import torch` gets)."""
import json
import os
import resource
import sys
import time

# The settings the step runners (run_mlp.py, run_cnn.py) interleave, round
# by round: (label, impl, threads, extra env, extra args). torch's 2-core
# settings are TORCH_T2; its best is the fastest of them in the same run.
STEP_SETTINGS = [
    ("dgrad t1", "dgrad", 1, {}, []),
    ("torch t1", "torch", 1, {}, []),
    ("dgrad t2", "dgrad", 2, {}, []),
    ("torch t2 omp=default", "torch", 2, {}, []),
    ("torch t2 omp=PASSIVE", "torch", 2, {"OMP_WAIT_POLICY": "PASSIVE"}, []),
    ("torch t2 intra1 blas2", "torch", 1, {}, ["--blas-threads", "2"]),
]
TORCH_T2 = ("torch t2 omp=default", "torch t2 omp=PASSIVE", "torch t2 intra1 blas2")


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


def _cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def time_steps(step, warmup, steps, max_seconds=0):
    """Runs step() warmup times, then times up to `steps` calls (stopping
    early past max_seconds when > 0). Returns (steps run, wall s, process
    CPU s over all threads, last step's result)."""
    for _ in range(warmup):
        step()
    t0, c0, done, out = time.perf_counter(), _cpu_s(), 0, None
    while done < steps:
        out = step()
        done += 1
        if max_seconds > 0 and time.perf_counter() - t0 > max_seconds:
            break
    return done, time.perf_counter() - t0, _cpu_s() - c0, out


def report(a, blas, done, wall, cpu, loss, **fields):
    """Prints the benchmark's JSON line: the fields every script reports,
    then `fields` (model, tokens_per_s, ...)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    line = {"impl": "torch", **fields, "batch": a.batch, "threads": a.threads, "steps": done,
            "steps_per_s": round(done / wall, 3), "cpu_ms_per_step": round(1e3 * cpu / done, 3),
            "peak_rss_mib": round(rss, 1), "heap_allocs_per_step": None,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
            "blas_threads": blas, "loss": round(float(loss), 5)}
    print(json.dumps(line), flush=True)
