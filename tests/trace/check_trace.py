"""Checks a Chrome trace JSON written by dgrad (dg_trace_write, or merged by
dgrun --trace): it parses; complete ("X") events nest per thread (B/E
balance: each one ends inside the one that encloses its start); async
"b"/"e" pairs balance per (pid, name, id); with --ranks N the events come
from pids 0..N-1 exactly, each named "rank R"; with --expect a,b,... every
pid has events of each name; with --inside a:b every "a" lies within a "b"
on its thread (b may be "b1|b2": within either). Exit status 1 with the reasons on failure.

Usage: python3 check_trace.py FILE [--ranks N] [--expect n1,n2] [--inside a:b]
"""
import argparse
import collections
import json
import sys


def ns(v):
    return int(round(float(v) * 1000))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--ranks", type=int, default=0)
    ap.add_argument("--expect", default="")
    ap.add_argument("--inside", action="append", default=[])
    a = ap.parse_args()
    bad = []
    with open(a.file) as f:
        doc = json.load(f)
    evs = doc["traceEvents"]
    data = [e for e in evs if e.get("ph") != "M"]
    meta = [e for e in evs if e.get("ph") == "M"]
    if not data:
        bad.append("no events")
    # X events nest per (pid, tid): a stack of open intervals
    by_thread = collections.defaultdict(list)
    for e in data:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]))
    for key, xs in by_thread.items():
        xs.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for t0, t1, name in xs:
            while stack and stack[-1][1] <= t0:
                stack.pop()
            if stack and t1 > stack[-1][1]:
                bad.append("pid %d tid %d: %s [%d, %d] overlaps %s [%d, %d] without nesting"
                           % (key[0], key[1], name, t0, t1, stack[-1][2], stack[-1][0], stack[-1][1]))
            stack.append((t0, t1, name))
    # async pairs
    opened = collections.Counter()
    for e in sorted((e for e in data if e["ph"] in "be"), key=lambda e: (ns(e["ts"]), e["ph"] == "b")):
        k = (e["pid"], e["name"], e["id"])
        opened[k] += 1 if e["ph"] == "b" else -1
        if opened[k] < 0:
            bad.append("async %s id %s of pid %d ends before it begins" % (e["name"], e["id"], e["pid"]))
    for k, v in opened.items():
        if v:
            bad.append("async %s id %s of pid %d: %d unmatched begin(s)" % (k[1], k[2], k[0], v))
    pids = sorted({e["pid"] for e in data})
    if a.ranks:
        if pids != list(range(a.ranks)):
            bad.append("pids %s, expected 0..%d (one per rank)" % (pids, a.ranks - 1))
        names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
        for r in range(a.ranks):
            if names.get(r) != "rank %d" % r:
                bad.append("pid %d is named %r, expected 'rank %d'" % (r, names.get(r), r))
    for name in filter(None, a.expect.split(",")):
        for p in pids:
            if not any(e["name"] == name and e["pid"] == p for e in data):
                bad.append("pid %d has no %r event" % (p, name))
    for spec in a.inside:
        inner, outer = spec.split(":")
        for key, xs in by_thread.items():
            outs = [x for x in xs if x[2] in outer.split("|")]
            for t0, t1, name in xs:
                if name == inner and not any(o0 <= t0 and t1 <= o1 for o0, o1, _ in outs):
                    bad.append("pid %d tid %d: %s at %d is not inside a %s" % (key[0], key[1], inner, t0, outer))
    for b in bad[:30]:
        print("check_trace:", b, flush=True)
    print("check_trace: %s: %d events, pids %s, %d problem(s)" % (a.file, len(data), pids, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
