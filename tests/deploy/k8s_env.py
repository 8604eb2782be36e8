#!/usr/bin/env python3
"""The Kubernetes manifests of examples/deploy/k8s, run as their pods would
run, without a cluster: each pod is a process in its own mount and UTS
namespace (unshare) with

  - the pod's host name (dgrad-mnist-master-0, dgrad-mnist-1, ...);
  - an /etc/hosts that resolves every pod and service name of the job, as
    the cluster's DNS would (pods on 127.0.0.2, 127.0.0.3, ...);
  - its own /dev/shm (the manifest's emptyDir), so only a pod's own
    processes share memory: between pods, TCP;
  - exactly the environment the controller produces: the container's env,
    plus for a PyTorchJob what the Kubeflow training operator adds
    (MASTER_ADDR = the master's service, MASTER_PORT = the port named
    pytorchjob-port, WORLD_SIZE = pods x nprocPerNode, RANK = PET_NODE_RANK
    = the pod's index, PET_NNODES, PET_NPROC_PER_NODE), and for an indexed
    Job JOB_COMPLETION_INDEX;
  - the container's command and args as written; only the volumes' paths
    (DATA_DIR, CKPT_DIR) and MNIST_ARGS (a short run) are the test's.

Checks, for both manifests (2 pods x 2 processes = 4 ranks): every pod
exits 0; the 4 ranks' losses are identical between the two manifests and
within 1e-5 of 4 ranks on one host (dgrun --nproc-per-node 4: shared memory
between all four); and, for the PyTorchJob, SIGTERM to one pod (a deletion
or preemption) stops every rank after the same step with a checkpoint, and
the pods started again resume from it with the uninterrupted losses, bit
for bit.

Exit 77 where namespaces cannot be made (not root, no unshare).

    python3 k8s_env.py SRCDIR path/to/mnist path/to/dgrun
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
from test_mnist_resume import make_data  # noqa: E402

N = 24  # steps of every run
fails = 0


def fail(msg):
    global fails
    fails += 1
    print("FAIL " + msg)


def container_env(c):
    return {e["name"]: str(e["value"]) for e in c.get("env", [])}


def pytorchjob_pods(doc):
    """The pods of a PyTorchJob and the environment the training operator
    (kubeflow.org/v1) gives each."""
    name, spec = doc["metadata"]["name"], doc["spec"]
    nproc = int(spec.get("nprocPerNode", "1"))
    reps = spec["pytorchReplicaSpecs"]
    total = sum(r["replicas"] for r in reps.values())
    pods = []
    for rtype in ("Master", "Worker"):
        r = reps.get(rtype)
        for i in range(r["replicas"] if r else 0):
            c = [c for c in r["template"]["spec"]["containers"] if c["name"] == "pytorch"][0]
            port = [p["containerPort"] for p in
                    reps["Master"]["template"]["spec"]["containers"][0]["ports"]
                    if p["name"] == "pytorchjob-port"][0]
            rank = i + (1 if rtype == "Worker" else 0)
            env = container_env(c)
            env.update(PYTHONUNBUFFERED="0", MASTER_ADDR="%s-master-0" % name,
                       MASTER_PORT=str(port), WORLD_SIZE=str(total * nproc), RANK=str(rank),
                       PET_NPROC_PER_NODE=str(nproc), PET_NODE_RANK=str(rank),
                       PET_NNODES=str(total))
            host = "%s-%s-%d" % (name, rtype.lower(), i)
            pods.append({"host": host, "names": [host], "env": env,
                         "cmd": c["command"] + c["args"], "nproc": nproc})
    return pods


def indexed_job_pods(docs):
    """The pods of an indexed Job behind a headless Service."""
    svc = [d for d in docs if d["kind"] == "Service"][0]
    job = [d for d in docs if d["kind"] == "Job"][0]
    name, js = job["metadata"]["name"], job["spec"]
    t = js["template"]["spec"]
    sub = t.get("subdomain")
    if (js.get("completionMode") != "Indexed" or sub != svc["metadata"]["name"] or
            svc["spec"].get("clusterIP") != "None" or
            svc["spec"]["selector"].get("job-name") != name or
            js["parallelism"] < js["completions"]):
        fail("indexed-job.yaml: not an indexed Job whose pods the headless Service names")
    c = t["containers"][0]
    pods = []
    for i in range(js["completions"]):
        env = container_env(c)
        env["JOB_COMPLETION_INDEX"] = str(i)
        host = "%s-%d" % (name, i)
        pods.append({"host": host, "names": [host, "%s.%s" % (host, sub),
                                             "%s.%s.default.svc.cluster.local" % (host, sub)],
                     "env": env, "cmd": c["command"] + c["args"],
                     "nproc": int(env.get("NPROC", "1"))})
    return pods


# In the pod's namespaces: its own /dev/shm, the job's /etc/hosts, its name.
POD_SETUP = ('mount -t tmpfs -o size=512m shm /dev/shm && mount --bind "$0" /etc/hosts && '
             'hostname "$1" && shift && exec "$@"')


def start_pods(pods, tmp, tag, extra):
    hosts = os.path.join(tmp, "hosts")
    with open(hosts, "w") as f:
        f.write("127.0.0.1 localhost\n")
        for k, p in enumerate(pods):
            f.write("127.0.0.%d %s\n" % (k + 2, " ".join(p["names"])))
    procs = []
    for p in pods:
        env = {"PATH": os.path.join(tmp, "bin") + ":/usr/bin:/bin", "HOSTNAME": p["host"]}
        env.update(p["env"])
        env.update(DATA_DIR=os.path.join(tmp, "data"), CKPT_DIR=os.path.join(tmp, tag),
                   MNIST_ARGS=" ".join(
                       ["--batch", "8", "--max-steps", str(N), "--log-every", "0",
                        "--threads", "1", "--seed", "4", "--loss-log",
                        os.path.join(tmp, tag + ".loss")] + extra))
        cmd = ["unshare", "--mount", "--uts", "--fork", "--", "/bin/sh", "-c", POD_SETUP,
               hosts, p["host"]] + p["cmd"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def wait_pods(procs, pods, tag):
    outs, rcs = [], []
    for p, pod in zip(procs, pods):
        try:
            out, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed after 180 s)"
        outs.append(out)
        rcs.append(p.returncode)
    return rcs, outs


def losses(tmp, tag, w=4):
    got = []
    for r in range(w):
        try:
            with open(os.path.join(tmp, "%s.loss.rank%d" % (tag, r))) as f:
                last = {}
                for x in f.read().split("\n"):
                    if x:
                        last[int(x.split()[0])] = x
                got.append([last[s] for s in sorted(last)])
        except FileNotFoundError:
            got.append([])
    return got


def run_job(pods, tmp, tag, extra=()):
    rcs, outs = wait_pods(start_pods(pods, tmp, tag, list(extra)), pods, tag)
    if any(rcs):
        fail("%s: pod exit codes %s\n%s" % (tag, rcs, "\n".join(outs)))
    return losses(tmp, tag), outs


def pod_dgrun(proc):
    """dgrun, the pod's first process: unshare's child (sh exec'ed into it)."""
    with open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)) as f:
        return int(f.read().split()[0])


def stop_and_restart(pods, tmp, full):
    tag = "stop"
    procs = start_pods(pods, tmp, tag, ["--throttle-ms", "25"])
    log0 = os.path.join(tmp, tag + ".loss.rank0")
    t_end = time.time() + 120
    while time.time() < t_end and all(p.poll() is None for p in procs):
        try:
            with open(log0) as f:
                if len(f.read().split("\n")) > 8:
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    os.kill(pod_dgrun(procs[1]), signal.SIGTERM)  # the worker pod is deleted
    rcs, outs = wait_pods(procs, pods, tag)
    stopped = sorted({x.split("stopped by signal 15 after step ")[1].split()[0]
                      for o in outs for x in o.split("\n") if "stopped by signal 15" in x})
    lines = sum(o.count("stopped by signal 15") for o in outs)
    if rcs[0] != 0 or rcs[1] not in (0, 143) or lines != 4 or len(stopped) != 1:
        fail("stop: pod exits %s, %d stop lines, steps %s\n%s" % (rcs, lines, stopped,
                                                                  "\n".join(outs)))
        return
    step = int(stopped[0])
    got, outs = run_job(pods, tmp, tag)
    resumed = sum(o.count("resumed from") for o in outs)
    if got != full or resumed != 4:
        fail("stop: resumed %d rank(s); losses after the restart differ\n%s\nvs\n%s\n%s"
             % (resumed, got, full, "\n".join(outs)))
    else:
        print("ok stop: SIGTERM to pod %s, all 4 ranks stopped after step %d (pod exits %s); "
              "the pods started again resumed and the %d losses of every rank equal the "
              "uninterrupted run's" % (pods[1]["host"], step, rcs, N))


def can_unshare():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "--mount", "--uts", "--fork", "--", "/bin/sh", "-c",
                        "mount -t tmpfs shm /dev/shm && hostname dgtest"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return r.returncode == 0


def main():
    src, exe, dgrun = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    if not can_unshare():
        print("SKIP: mount and UTS namespaces need root and unshare (util-linux)")
        return 77
    k8s = os.path.join(src, "examples", "deploy", "k8s")
    with open(os.path.join(k8s, "pytorchjob.yaml")) as f:
        pj = pytorchjob_pods(next(yaml.safe_load_all(f)))
    with open(os.path.join(k8s, "indexed-job.yaml")) as f:
        ij = indexed_job_pods(list(yaml.safe_load_all(f)))
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        os.mkdir(os.path.join(tmp, "data"))
        make_data(os.path.join(tmp, "data"))
        os.mkdir(os.path.join(tmp, "bin"))
        os.symlink(exe, os.path.join(tmp, "bin", "mnist"))
        os.symlink(dgrun, os.path.join(tmp, "bin", "dgrun"))
        # 4 ranks on one host: the reference
        ref = os.path.join(tmp, "ref.loss")
        p = subprocess.run([dgrun, "--nproc-per-node", "4", "--", exe, "--data",
                            os.path.join(tmp, "data"), "--batch", "8", "--max-steps", str(N),
                            "--log-every", "0", "--threads", "1", "--seed", "4",
                            "--loss-log", ref], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=180)
        if p.returncode:
            fail("reference run: exit %d\n%s" % (p.returncode, p.stdout))
        one_host = losses(tmp, "ref")
        got = {}
        for tag, pods in (("pytorchjob", pj), ("indexed", ij)):
            got[tag], outs = run_job(pods, tmp, tag)
            worst = 0.0
            for a, b in zip(got[tag], one_host):
                if len(a) != N or len(b) != N:
                    worst = 1.0
                    break
                for x, y in zip(a, b):
                    u, v = float.fromhex(x.split()[1]), float.fromhex(y.split()[1])
                    worst = max(worst, abs(u - v) / abs(v))
            if worst > 1e-5:
                fail("%s: losses differ from 4 ranks on one host by %g\n%s\n%s"
                     % (tag, worst, got[tag], "\n".join(outs)))
            else:
                print("ok %s: %d pods x %d processes, %d steps, every pod exit 0; losses "
                      "within %.1e of 4 ranks on one host"
                      % (tag, len(pods), pods[0]["nproc"], N, worst))
        if got["pytorchjob"] != got["indexed"]:
            fail("the two manifests' runs differ:\n%s\nvs\n%s" % (got["pytorchjob"],
                                                                 got["indexed"]))
        else:
            print("ok: the PyTorchJob's and the indexed Job's losses are identical")
        stop_and_restart(pj, tmp, got["pytorchjob"])
    print("%d failure(s)" % fails if fails else "ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
