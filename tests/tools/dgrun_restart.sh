# dgrun: --max-restarts restarts the whole group; DG_RESTART_COUNT tells it.
. "$(dirname "$0")/lib.sh"

# Every rank reports its try; until the third try, rank 1 fails (once rank 0
# has reported, so that it is not stopped before) and rank 0 hangs.
export SYNC="$TMP"
prog='echo "try $DG_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT $MASTER_PORT"
  [ "$DG_RESTART_COUNT" -ge 2 ] && exit 0
  if [ "$RANK" = 0 ]; then touch "$SYNC/r0.$DG_RESTART_COUNT"; sleep 60; fi
  i=0; while [ ! -e "$SYNC/r0.$DG_RESTART_COUNT" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  exit 4'

run two --nproc-per-node 2 --max-restarts 2 sh -c "$prog"
expect_rc 0 "--max-restarts 2"
for n in 0 1 2; do count two.out "^\[rank [01]\] try $n $n [0-9]+\$" 2; done
has two.err "^dgrun: restart 1 of 2: .*fresh port"
has two.err "^dgrun: restart 2 of 2: "
count two.err "exited with status 4" 2

rm -f "$SYNC"/r0.*
run one --nproc-per-node 2 --max-restarts 1 sh -c "$prog"
expect_rc 4 "--max-restarts 1"
hasnt one.out "try 2"
count one.out "try [01] [01]" 4
has one.err "^dgrun: restart 1 of 1: "
has one.err "^dgrun: giving up after 1 restart\(s\); exit status 4\$"

rm -f "$SYNC"/r0.*
run zero --nproc-per-node 2 sh -c "$prog"
expect_rc 4 "no restarts"
hasnt zero.err restart

# A fixed port stays fixed across restarts.
rm -f "$SYNC"/r0.*
run fixed --nproc-per-node 2 --master-port 23458 --max-restarts 2 sh -c "$prog"
expect_rc 0 "fixed port"
count fixed.out "^\[rank [01]\] try [012] [012] 23458\$" 6

# A program that cannot be run is not restarted.
run noexec --nproc-per-node 2 --max-restarts 3 /nonexistent/program
expect_rc 127 "missing program"
has noexec.err "^dgrun: cannot execute '/nonexistent/program': No such file or directory\$"
hasnt noexec.err restart
finish
