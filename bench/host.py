#!/usr/bin/python3
"""The host a benchmark runs on: a reproducible background load, CPU steal
time, the CPU model and free TCP ports. Standard library only; imported by
bench/run_all.py, bench/ddp/run_ddp.py and bench/dist/run_allreduce.py.

Background load ("noisy host"): `Load(share)` starts one burner process per
core, pinned to it, that spins for `burst_ms` of CPU time at a random moment
of every period of burst_ms / share (so `share` of each core, in bursts at
random times, the way another tenant's work or a hypervisor's steal takes
it), and stops them on exit. Bursts are counted in the burner's own CPU
time, so on a machine already busy a burst lasts longer rather than taking
less. The burners run at the benchmark's own priority, so the
scheduler hands them the core as soon as they wake, as it would a neighbour.

    with Load(0.10, burst_ms=20, seed=1) as ld:
        ... run the benchmark ...
    ld.measured   # CPU the burners actually took, share of each core

    /usr/bin/python3 bench/host.py --burn CPU --share S --burst-ms B --seed N
        (one burner; what Load starts; runs until killed)
    /usr/bin/python3 bench/host.py --info     (CPU model, cores, steal so far)
    core_rtt_ns(build_dir)  the cross-core round trip now (bench/corelat.c)
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TICK = os.sysconf("SC_CLK_TCK")


def steal_s():
    """CPU steal time of the whole machine since boot, seconds (the 8th field
    of /proc/stat's "cpu" line; 0 where the kernel does not count it)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu "):
                    v = line.split()
                    return int(v[8]) / TICK if len(v) > 8 else 0.0
    except OSError:
        pass
    return 0.0


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def cores():
    """Cores this process may run on (what the benchmarks get)."""
    return len(os.sched_getaffinity(0))


def core_rtt_ns(build_dir):
    """The cross-core round trip between the first two CPUs this process may
    use, ns (bench/corelat.c: a cache line passed back and forth), or None
    without the program or a second CPU. On a VM it moves as the host places
    the virtual CPUs (55-90 ns sharing a cache, 300-350 ns across), and DDP's
    ranks pay it on every line they exchange."""
    exe = os.path.join(os.path.dirname(HERE), build_dir, "bench", "corelat")  # absolute wins
    try:
        p = subprocess.run([exe], capture_output=True, text=True, timeout=30)
        return json.loads(p.stdout.strip().splitlines()[-1])["core_rtt_ns"]
    except (OSError, ValueError, KeyError, IndexError, subprocess.TimeoutExpired):
        return None


def _bind_ok(port):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]
    except OSError:
        return 0
    finally:
        s.close()


def free_port():
    """A port free on loopback now, below the ephemeral range, so that no
    outgoing connection of another process takes it between this check and
    the benchmark's bind (tests/fault/fork_util.h fu_free_port does the same;
    a random port inside the range collided once)."""
    lo = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        if lo <= 21024:
            break
        port = rng.randrange(20000, lo)
        if _bind_ok(port) == port:
            return port
    return _bind_ok(0)  # an odd port range: the kernel's choice


def _burn(cpu, share, burst_ms, seed):
    """One burner: pinned to `cpu`, spins burst_ms of CPU time at a random
    point of each period of burst_ms / share, forever (until SIGTERM)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        pass  # a core we may not use: burn wherever the scheduler puts us
    rng = random.Random(seed * 1000003 + cpu)
    burst = burst_ms / 1000.0
    period = burst / share
    t = time.monotonic()
    while True:
        start = t + rng.uniform(0.0, period - burst)
        time.sleep(max(0.0, start - time.monotonic()))
        end, cap = time.process_time() + burst, time.monotonic() + period
        while time.process_time() < end and time.monotonic() < cap:
            pass
        t += period
        if time.monotonic() > t + period:  # descheduled for long: start afresh
            t = time.monotonic()
        else:
            time.sleep(max(0.0, t - time.monotonic()))


def _proc_cpu_s(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (int(v[11]) + int(v[12])) / TICK  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


class Load:
    """Background load on every core (see the module's doc); share 0: none.
    Raises ValueError for a share outside [0, 0.9] or a burst <= 0."""

    def __init__(self, share, burst_ms=20.0, seed=1):
        if not 0.0 <= share <= 0.9:
            raise ValueError("load share %g outside [0, 0.9]" % share)
        if burst_ms <= 0:
            raise ValueError("load burst %g ms must be > 0" % burst_ms)
        self.share, self.burst_ms, self.seed = share, burst_ms, seed
        self.procs, self.measured, self.t0 = [], 0.0, 0.0

    def __enter__(self):
        if self.share > 0:
            for cpu in sorted(os.sched_getaffinity(0)):
                self.procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--burn", str(cpu), "--share",
                     str(self.share), "--burst-ms", str(self.burst_ms), "--seed",
                     str(self.seed)]))
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def stop(self):
        """Stops the burners (idempotent); sets .measured."""
        if not self.procs:
            return
        wall = time.monotonic() - self.t0
        used = sum(_proc_cpu_s(p.pid) for p in self.procs)
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self.measured = used / (wall * len(self.procs)) if wall > 0 else 0.0
        self.procs = []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--burn", type=int, help="run one burner pinned to this CPU")
    ap.add_argument("--share", type=float, default=0.1)
    ap.add_argument("--burst-ms", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--info", action="store_true")
    a = ap.parse_args()
    if a.burn is not None:
        if not 0 < a.share <= 0.9 or a.burst_ms <= 0:
            ap.error("--share must be in (0, 0.9] and --burst-ms > 0")
        _burn(a.burn, a.share, a.burst_ms, a.seed)
    elif a.info:
        print(json.dumps({"cpu": cpu_model(), "cores": cores(), "steal_s": steal_s(),
                          "free_port": free_port()}))
    else:
        ap.error("--burn CPU or --info")


if __name__ == "__main__":
    main()
