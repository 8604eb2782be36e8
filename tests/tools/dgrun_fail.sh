# dgrun: a failing or killed rank stops the group fast, named, with its status.
. "$(dirname "$0")/lib.sh"

# Rank 1 exits 3 while rank 0 sleeps 60 s: dgrun stops rank 0 and exits 3.
run exit3 --nproc-per-node 2 sh -c \
  'if [ "$RANK" = 1 ]; then echo "rank one fails"; sleep 0.2; exit 3; fi; sleep 60'
expect_rc 3 "rank exiting 3"
faster_than 5000 "rank exiting 3"
has exit3.err "^dgrun: rank 1 \(pid [0-9]+\) exited with status 3\$"
has exit3.out "^\[rank 1\] rank one fails\$"
hasnt exit3.err "rank 0 \(pid"

# Three ranks, rank 2 killed by SIGKILL: exit status 128+9.
run sigkill --nproc-per-node 3 sh -c \
  'if [ "$RANK" = 2 ]; then sleep 0.2; kill -KILL $$; fi; sleep 60'
expect_rc 137 "rank killed by SIGKILL"
faster_than 5000 "rank killed by SIGKILL"
has sigkill.err "^dgrun: rank 2 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\)\$"

# A rank that ignores SIGTERM gets SIGKILL after the grace period.
# (Rank 0 fails once rank 1 has installed its trap.)
export SYNC="$TMP"
run grace --nproc-per-node 2 --grace-seconds 1 sh -c \
  'trap "" TERM
   if [ "$RANK" = 1 ]; then touch "$SYNC/r1"; while :; do sleep 0.1; done; fi
   i=0; while [ ! -e "$SYNC/r1" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
   exit 5'
expect_rc 5 "rank ignoring SIGTERM"
has grace.err "^dgrun: rank 0 \(pid [0-9]+\) exited with status 5\$"
has grace.err "^dgrun: rank 1 \(pid [0-9]+\) still running 1 s after SIGTERM; sending SIGKILL\$"
[ "$ms" -ge 1000 ] || fail "SIGKILL came after $ms ms, before the 1 s grace period"
faster_than 5000 "rank ignoring SIGTERM"

# Grandchildren holding the pipes open do not keep dgrun waiting.
run grandchild sh -c 'sleep 60 & echo started; exit 0'
expect_rc 0 "rank leaving a background child"
faster_than 5000 "rank leaving a background child"
has grandchild.out "^\[rank 0\] started\$"

# Every rank succeeding: 0, and no dgrun message.
run ok --nproc-per-node 4 true
expect_rc 0 "four ranks exiting 0"
count ok.err . 0
finish
