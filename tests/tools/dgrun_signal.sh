# dgrun: SIGINT/SIGTERM to dgrun is forwarded to the ranks, then teardown.
. "$(dirname "$0")/lib.sh"
export SYNC="$TMP"

# start NAME GRACE TRAP [ACTION]: run dgrun in the background with 2 ranks
# that run TRAP (shell trap commands), say ready, run ACTION and loop; wait
# until both are ready.
# dgrun is signalled directly (timeout(1) would relay signals to the whole
# process group), so a watchdog bounds it instead. A background job of a
# script starts with SIGINT ignored; env --default-signal undoes that.
start() {
  name=$1
  : >"$TMP/$name.out"
  env --default-signal=INT,QUIT "$DGRUN" --nproc-per-node 2 --grace-seconds "$2" \
    sh -c "$3; echo ready; ${4:-:}; while :; do sleep 0.1; done" \
    >"$TMP/$name.out" 2>"$TMP/$name.err" &
  pid=$!
  (sleep 30 && kill -KILL $pid) >/dev/null 2>&1 &
  watchdog=$!
  t=0
  while [ "$(grep -c ready "$TMP/$name.out")" != 2 ] && [ $t -lt 100 ]; do
    sleep 0.1; t=$((t + 1))
  done
  [ $t -lt 100 ] || fail "$name: ranks did not start within 10 s"
  t0=$(now_ms)
}

# finish_run: wait for dgrun -> $rc, $ms
finish_run() {
  wait $pid
  rc=$?
  ms=$(( $(now_ms) - t0 ))
  kill $watchdog 2>/dev/null
  [ $rc != 137 ] || [ "$name" = orphan ] ||
    fail "$name: dgrun hung and was killed by the watchdog"
}

# send SIG: ranks report the signal they get; signal dgrun once.
send() {
  start "$1" 2 "trap 'echo got $1; exit 9' $1"
  kill -"$1" $pid
  finish_run
}

send TERM
expect_rc 143 "SIGTERM to dgrun"
faster_than 1500 "SIGTERM to dgrun"
count TERM.out "^\[rank [01]\] got TERM\$" 2
has TERM.err "^dgrun: received SIGTERM; forwarding it to the ranks"
hasnt TERM.err "SIGKILL to the ranks"

send INT
expect_rc 130 "SIGINT to dgrun"
faster_than 1500 "SIGINT to dgrun"
count INT.out "^\[rank [01]\] got INT\$" 2
hasnt INT.err restart

# Ranks that ignore SIGTERM, long grace period: SIGTERM again a second later
# sends SIGKILL at once.
start twice 20 'trap "" TERM'
kill -TERM $pid
sleep 1.3
kill -TERM $pid
finish_run
expect_rc 143 "SIGTERM twice"
faster_than 5000 "SIGTERM twice"
has twice.err "^dgrun: received SIGTERM again; sending SIGKILL to the ranks\$"

# A signal during the teardown after a failure is forwarded too, and wins.
start during 20 'trap "" TERM; trap "echo got INT; exit 9" INT' \
  'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi'
t=0
while ! grep -q "exited with status 3" "$TMP/during.err" && [ $t -lt 100 ]; do
  sleep 0.1; t=$((t + 1))
done
kill -INT $pid
finish_run
expect_rc 130 "SIGINT during failure teardown"
faster_than 3000 "SIGINT during failure teardown"
has during.err "^dgrun: rank 1 \(pid [0-9]+\) exited with status 3\$"
count during.out "^\[rank 0\] got INT\$" 1

# dgrun killed with SIGKILL (it cannot forward anything): the ranks die too.
start orphan 2 'echo $$ >"$SYNC/pid.$RANK"'
kill -KILL $pid
finish_run
for r in 0 1; do
  rpid=$(cat "$TMP/pid.$r")
  t=0
  while kill -0 "$rpid" 2>/dev/null && [ $t -lt 50 ]; do sleep 0.1; t=$((t + 1)); done
  if kill -0 "$rpid" 2>/dev/null; then
    fail "rank $r (pid $rpid) outlived dgrun by 5 s"
    kill -KILL "$rpid"
  fi
done
finish
