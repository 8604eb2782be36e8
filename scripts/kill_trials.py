#!/usr/bin/env python3
"""Kill and stop trials (issue #17 item 5): DDP training at world size 4
under dgrun (tests/netns/ddp_worker), one rank SIGKILLed, or SIGSTOPped, at
a random moment of training. For every trial it records how long each
survivor took to fail (from the signal to its error line, and to its exit),
whether each survivor's message names the signalled rank, dgrun's exit
status and whether its message names that rank, whether anything hung, and
what was left behind: a process of the trial, a /dev/shm/dgrad-<pid>-*
segment of one of its ranks, or a socket still open on its port.

    scripts/kill_trials.py --build build [--trials 20] [--stops 5] [--seed S]
                           [--stop-timeout-ms 5000] [--out trials.jsonl]

Targets (exit status 1 when one is missed): after a kill every survivor
fails in under --max-fail-s (2 s) naming the killed rank; after a stop
every survivor fails at the group timeout (--stop-timeout-ms, the group's
timeout in these runs) plus at most --max-fail-s, naming the stopped rank;
dgrun exits non-zero naming the rank; no trial hangs; nothing is left.
One JSON object per trial in --out (default: kill_trials.jsonl in the
current directory), then a summary object. Needs Linux (pidfd_open).
"""
import argparse
import json
import os
import random
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

WORLD = 4


def free_port(rng):
    """A random free port below the ephemeral range (as tests/fault/fork_util.h)."""
    for _ in range(200):
        p = rng.randrange(20000, 32000)
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
            return p
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port found")


class Reader(threading.Thread):
    """Collects (monotonic time, line) from one of dgrun's pipes."""

    def __init__(self, f):
        super().__init__(daemon=True)
        self.f, self.lines, self.mu = f, [], threading.Lock()

    def run(self):
        for line in iter(self.f.readline, ""):
            with self.mu:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def snapshot(self):
        with self.mu:
            return list(self.lines)


class ExitWatch(threading.Thread):
    """Records when each process ends (pidfds: exact, not polled)."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.fds = {}
        for pid in pids:
            try:
                self.fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                pass
        self.exited = {}

    def run(self):
        left = dict(self.fds)
        while left:
            ready, _, _ = select.select(list(left), [], [], 1.0)
            for fd in ready:
                self.exited[left.pop(fd)] = time.monotonic()
                os.close(fd)


def rank_pids(dgrun_pid):
    """{rank: pid} of dgrun's children, from their RANK variable."""
    out = {}
    try:
        with open("/proc/%d/task/%d/children" % (dgrun_pid, dgrun_pid)) as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        return out
    for pid in kids:
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
            out[int(env[b"RANK"])] = pid
        except (OSError, KeyError, ValueError):
            pass
    return out


def wait_until(cond, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return False


def sockets_on(port):
    """Sockets on `port` in /proc/net/tcp{,6} other than TIME_WAIT (06),
    which is the kernel's, not a process's."""
    found = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for row in f:
                    c = row.split()
                    lport = int(c[1].rsplit(":", 1)[1], 16)
                    rport = int(c[2].rsplit(":", 1)[1], 16)
                    if port in (lport, rport) and c[3] != "06":
                        found.append("%s %s state %s" % (c[1], c[2], c[3]))
        except OSError:
            pass
    return found


def leftovers(pids, port):
    left = []
    for pid in pids:
        if os.path.exists("/proc/%d" % pid):
            left.append("process %d still exists" % pid)
        try:
            left += ["/dev/shm/" + n for n in os.listdir("/dev/shm")
                     if n.startswith("dgrad-%d-" % pid)]
        except OSError:
            pass
    left += ["socket " + s for s in sockets_on(port)]
    return left


ERR = re.compile(r"^\[rank (\d+)\] ddp_worker: rank (\d+): step \d+: (.*)$")


def trial(a, rng, kind, n):
    """One trial: returns its record (a dict)."""
    port = free_port(rng)
    sig = signal.SIGKILL if kind == "kill" else signal.SIGSTOP
    timeout_ms = a.stop_timeout_ms if kind == "stop" else a.kill_timeout_ms
    cmd = [a.dgrun, "--nproc-per-node", str(WORLD), "--master-port", str(port),
           "--grace-seconds", str(a.grace), "--", a.worker, "--steps", "1000000",
           "--sleep-ms", "1", "--timeout-ms", str(timeout_ms)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    out, err = Reader(p.stdout), Reader(p.stderr)
    out.start()
    err.start()
    rec = {"trial": n, "kind": kind, "port": port, "ok": False}
    pids = {}

    def started():
        return any(" step " in x for _, x in out.snapshot()) and \
            sum(1 for _, x in err.snapshot() if x.endswith(": ready")) == WORLD
    if not wait_until(started, 60) or len(pids := rank_pids(p.pid)) != WORLD:
        rec["error"] = "the group did not start: " + " | ".join(x for _, x in err.snapshot())
        os.killpg(p.pid, signal.SIGKILL)
        for pid in rank_pids(p.pid).values():
            os.kill(pid, signal.SIGKILL)
        p.wait()
        return rec
    victim = rng.randrange(WORLD)
    delay = rng.uniform(0, a.max_delay)
    time.sleep(delay)
    watch = ExitWatch([pid for r, pid in pids.items() if r != victim])
    watch.start()
    t0 = time.monotonic()
    os.kill(pids[victim], sig)
    steps = [x for _, x in out.snapshot() if " step " in x]
    rec.update(victim=victim, delay_s=round(delay, 3), signal=kind,
               steps_before=len(steps))
    limit = (timeout_ms / 1000 if kind == "stop" else 0) + a.grace + 30
    try:
        rc = p.wait(timeout=limit)
        rec["hang"] = False
    except subprocess.TimeoutExpired:
        rec["hang"] = True
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(p.pid, signal.SIGKILL)
        rc = p.wait()
    out.join(5)
    err.join(5)
    watch.join(5)
    rec["dgrun_rc"] = rc
    lines = err.snapshot()
    dg = [x for _, x in lines if x.startswith("dgrun: ")]
    rec["dgrun_messages"] = dg
    rec["dgrun_names_rank"] = any(re.search(r"\brank %d\b" % victim, x) for x in dg)
    surv = {}
    for t, x in lines:
        m = ERR.match(x)
        if m and int(m.group(1)) != victim and int(m.group(1)) not in surv:
            surv[int(m.group(1))] = {
                "fail_s": round(t - t0, 4), "message": m.group(3),
                "names_rank": bool(re.search(r"\brank %d\b" % victim, m.group(3)))}
    for r, pid in pids.items():
        if r == victim:
            continue
        s = surv.setdefault(r, {"fail_s": None, "message": None, "names_rank": False})
        s["exit_s"] = round(watch.exited[pid] - t0, 4) if pid in watch.exited else None
    rec["survivors"] = {str(r): surv[r] for r in sorted(surv)}
    rec["leftovers"] = leftovers(list(pids.values()), port)
    lo = timeout_ms / 1000 if kind == "stop" else 0
    in_time = all(s["fail_s"] is not None and lo * 0.9 <= s["fail_s"] < lo + a.max_fail_s
                  for s in surv.values())
    rec["ok"] = (not rec["hang"] and rc != 0 and rec["dgrun_names_rank"] and in_time and
                 all(s["names_rank"] for s in surv.values()) and not rec["leftovers"])
    return rec


def summary(recs, kind):
    rs = [r for r in recs if r["kind"] == kind]
    times = sorted(s["fail_s"] for r in rs for s in r.get("survivors", {}).values()
                   if s["fail_s"] is not None)
    return {
        "kind": kind, "trials": len(rs), "passed": sum(r["ok"] for r in rs),
        "hangs": sum(bool(r.get("hang")) for r in rs),
        "leftovers": sum(len(r.get("leftovers", [])) for r in rs),
        "survivor_fail_s": {"n": len(times), "min": times[0] if times else None,
                            "median": statistics.median(times) if times else None,
                            "max": times[-1] if times else None},
        "messages_naming_rank": sum(s["names_rank"] for r in rs
                                    for s in r.get("survivors", {}).values()),
        "dgrun_naming_rank": sum(bool(r.get("dgrun_names_rank")) for r in rs),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", help="build directory (finds tools/dgrun and "
                    "tests/netns/ddp_worker in it)")
    ap.add_argument("--dgrun")
    ap.add_argument("--worker")
    ap.add_argument("--trials", type=int, default=20, help="SIGKILL trials")
    ap.add_argument("--stops", type=int, default=5, help="SIGSTOP trials")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--stop-timeout-ms", type=int, default=5000,
                    help="the group's timeout in stop trials")
    ap.add_argument("--kill-timeout-ms", type=int, default=60000,
                    help="the group's timeout in kill trials (a kill must be found sooner)")
    ap.add_argument("--max-fail-s", type=float, default=2.0)
    ap.add_argument("--max-delay", type=float, default=1.5,
                    help="the signal comes uniformly within this many seconds of training")
    ap.add_argument("--grace", type=float, default=10.0, help="dgrun --grace-seconds")
    ap.add_argument("--out", default="kill_trials.jsonl")
    a = ap.parse_args()
    if a.build:
        a.dgrun = a.dgrun or os.path.join(a.build, "tools", "dgrun")
        a.worker = a.worker or os.path.join(a.build, "tests", "netns", "ddp_worker")
    if not a.dgrun or not a.worker:
        ap.error("give --build, or --dgrun and --worker")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print("kill_trials: seed %d (--seed %d reproduces the choices)" % (seed, seed))
    recs = []
    kinds = ["kill"] * a.trials + ["stop"] * a.stops
    with open(a.out, "w") as f:
        for n, kind in enumerate(kinds):
            r = trial(a, rng, kind, n)
            recs.append(r)
            f.write(json.dumps(r) + "\n")
            f.flush()
            times = [s["fail_s"] for s in r.get("survivors", {}).values()]
            print("trial %2d %s rank %s after %.3f s: %s; survivors failed after %s s; "
                  "dgrun rc %s%s" % (n, kind, r.get("victim"), r.get("delay_s", 0),
                                      "ok" if r["ok"] else "FAILED", times,
                                      r.get("dgrun_rc"),
                                      "" if r["ok"] else "\n  " + json.dumps(r)))
        sums = [summary(recs, k) for k in ("kill", "stop") if k in kinds]
        for s in sums:
            f.write(json.dumps(dict(s, summary=True, seed=seed)) + "\n")
            print("summary: " + json.dumps(s))
    return 0 if all(r["ok"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
