#!/bin/bash
# A real one-node Slurm cluster on loopback (munged, slurmctld, slurmd, all
# as root, configured in a temp dir) runs examples/deploy/mnist.sbatch: 2
# tasks by srun reading SLURM_*; `scancel --signal=TERM` makes every rank
# checkpoint and exit 0; `scontrol requeue` resumes it from the checkpoint
# directory, and the losses equal an uninterrupted 2-rank run's (dgrun).
# Exit 77 (skipped) only where Slurm cannot start: not root, no slurm-wlm
# or munge (scripts/setup.sh --tests installs them), daemons that die.
# Every daemon is stopped at the end, whatever happens (trap).
#   slurm.sh SRCDIR path/to/mnist path/to/dgrun
set -u
SRC=$1 MNIST=$(readlink -f "$2") DGRUN=$(readlink -f "$3")
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (daemons, munge key)"
for b in munged mungekey slurmctld slurmd sbatch scontrol scancel srun; do
  command -v "$b" >/dev/null || skip "$b not found (apt-get install slurm-wlm munge)"
done
T=$(mktemp -d /tmp/dg_slurm_XXXXXX)
chmod 755 "$T"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
show() { for f in "$@"; do echo "--- $f" >&2; sed 's/^/  | /' "$f" >&2; done; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---- munge ----
mkdir -p "$T/munge" "$T/state" "$T/spool"
chmod 700 "$T/munge"
mungekey -c -k "$T/munge/munge.key" >/dev/null 2>&1 || skip "mungekey cannot create a key"
munged -F -f --key-file="$T/munge/munge.key" --socket="$T/munge/sock" \
  --pid-file="$T/munge/pid" --log-file="$T/munge/log" --seed-file="$T/munge/seed" \
  >/dev/null 2>&1 &
pids+=($!)
for i in $(seq 50); do [ -S "$T/munge/sock" ] && break; sleep 0.1; done
[ -S "$T/munge/sock" ] || { show "$T/munge/log"; skip "munged did not start"; }

# ---- slurm.conf: this host as the controller and the one node ----
host=$(hostname)
getent hosts "$host" >/dev/null || skip "host name $host does not resolve"
export SLURM_CONF="$T/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=dgtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=dgq Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -i >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$host" >"$T/slurmd.out" 2>&1 &
pids+=($!)
up=0
for i in $(seq 100); do
  if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then up=1; break; fi
  sleep 0.2
done
[ $up = 1 ] || { show "$T/slurmctld.log" "$T/slurmd.log" "$T/slurmctld.out" "$T/slurmd.out"
                 skip "the one-node cluster did not come up"; }
echo "slurm: node $host up ($(sinfo -h -o '%P %t %c'))"

# ---- the job ----
python3 -c "import sys; sys.path.insert(0, '$SRC/tests/ckpt'); from test_mnist_resume import make_data; make_data('$T')"
common=(--data "$T" --model mlp --optim adamw --batch 8 --epochs 40 --threads 1 --seed 4
        --log-every 0 --max-steps 60)
timeout 120 "$DGRUN" --nproc-per-node 2 -- "$MNIST" "${common[@]}" --loss-log "$T/ref.log" \
  >"$T/ref.out" 2>&1 || { show "$T/ref.out"; fail "the reference run under dgrun failed"; }
export DGRAD_MNIST="$MNIST" CKPT_DIR="$T/ckpt"
job=$(sbatch --parsable --output="$T/job.out" --chdir="$T" "$SRC/examples/deploy/mnist.sbatch" \
      "${common[@]}" --loss-log "$T/job.log" --throttle-ms 25) ||
  { show "$T/slurmctld.log"; fail "sbatch refused the job"; exit 1; }
state() { scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# wait_state REGEX SECONDS
wait_state() {
  for i in $(seq $(($2 * 10))); do [[ "$(state)" =~ $1 ]] && return 0; sleep 0.1; done
  return 1
}
for i in $(seq 600); do
  [ -f "$T/job.log.rank0" ] && [ "$(wc -l <"$T/job.log.rank0")" -ge 10 ] && break
  sleep 0.1
done
[ "$(state)" = RUNNING ] || { show "$T/job.out" "$T/slurmd.log"; fail "job $job is $(state)"; exit 1; }
t0=$(date +%s%N)
scancel --signal=TERM "$job"
wait_state '^(COMPLETED|FAILED|CANCELLED|TIMEOUT)$' 60 || fail "job $job still $(state) 60 s after SIGTERM"
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$(state)" = COMPLETED ] || { show "$T/job.out"; fail "after SIGTERM job $job is $(state), expected COMPLETED (every rank exits 0)"; }
n=$(grep -c "stopped by signal 15 after step" "$T/job.out")
[ "$n" = 2 ] || { show "$T/job.out"; fail "$n rank(s) say they stopped, expected 2"; }
step=$(sed -n 's/.*stopped by signal 15 after step \([0-9]*\).*/\1/p' "$T/job.out" | sort -u)
[ "$(echo "$step" | wc -l)" = 1 ] || fail "ranks stopped after different steps: $step"
echo "slurm: scancel --signal=TERM: both ranks stopped after step $step, job COMPLETED after $ms ms"

scontrol requeue "$job" || fail "scontrol requeue $job failed"
# a requeued job waits for a begin time set a while ahead; start it now
scontrol update JobId="$job" StartTime=now >/dev/null 2>&1
wait_state '^RUNNING$' 30 >/dev/null
wait_state '^(COMPLETED|FAILED|CANCELLED|TIMEOUT)$' 120 || fail "requeued job $job still $(state)"
[ "$(state)" = COMPLETED ] || { show "$T/job.out"; fail "requeued job $job is $(state)"; }
grep -q "restart 1: 2 tasks" "$T/job.out" || fail "no SLURM_RESTART_COUNT=1 in the requeued run"
grep -qE "resumed from $T/ckpt/ckpt-0*$step.safetensors: step $step," "$T/job.out" ||
  { show "$T/job.out"; fail "the requeued job did not resume from step $step"; }
for r in 0 1; do
  if cmp -s "$T/ref.log.rank$r" "$T/job.log.rank$r"; then
    echo "slurm: rank $r: $(wc -l <"$T/job.log.rank$r") losses identical to the uninterrupted run's"
  else
    fail "rank $r: the losses differ from the uninterrupted run's"
    diff "$T/ref.log.rank$r" "$T/job.log.rank$r" | head -5 >&2
  fi
done
if [ $fails = 0 ]; then echo ok; exit 0; fi
show "$T/job.out"
echo "$fails check(s) failed" >&2
exit 1
