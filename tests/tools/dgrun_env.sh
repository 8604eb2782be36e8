# dgrun: environment of the ranks, output prefixes, stream routing, whole lines.
. "$(dirname "$0")/lib.sh"

# Three ranks echo their environment; stderr goes to stderr only.
run env --nproc-per-node 3 sh -c \
  'echo "env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $DG_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT"; echo "to-stderr $RANK" >&2'
expect_rc 0 "3 ranks"
for r in 0 1 2; do
  count env.out "^\[rank $r\] env $r 3 $r 3 0 127\.0\.0\.1 [0-9]+ 0 0\$" 1
  count env.err "^\[rank $r\] to-stderr $r\$" 1
done
count env.out . 3
hasnt env.out to-stderr
hasnt env.err "^\[rank [0-9]\] env"
# One auto-picked port, shared by all ranks, never 0.
ports=$(sed -n 's/.* \([0-9][0-9]*\) 0 0$/\1/p' "$TMP/env.out" | sort -u)
[ "$(echo "$ports" | wc -l)" = 1 ] || fail "ranks disagree on MASTER_PORT: $ports"
[ -n "$ports" ] && [ "$ports" -gt 0 ] || fail "MASTER_PORT '$ports' should be a port"

# Explicit address and port, '=' and '_' spellings, '--' before the program.
run explicit --nproc_per_node=2 --master-addr=localhost --master-port 23456 -- \
  sh -c 'echo "$RANK $MASTER_ADDR $MASTER_PORT"'
expect_rc 0 "explicit port"
count explicit.out "^\[rank [01]\] [01] localhost 23456\$" 2

# Second node of two: global ranks 2 and 3, node rank 1.
run node1 --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-port 23457 \
  sh -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $GROUP_WORLD_SIZE"'
expect_rc 0 "node rank 1"
count node1.out "^\[rank 2\] 2 4 0 1 2\$" 1
count node1.out "^\[rank 3\] 3 4 1 1 2\$" 1

# OMP_NUM_THREADS: 1 by default with several ranks, a user's value kept.
run omp --nproc-per-node 2 sh -c 'echo "omp=$OMP_NUM_THREADS"'
count omp.out "^\[rank [01]\] omp=1\$" 2
OMP_NUM_THREADS=3 run omp3 --nproc-per-node 2 sh -c 'echo "omp=$OMP_NUM_THREADS"'
count omp3.out "^\[rank [01]\] omp=3\$" 2

# A last line without newline is still printed, whole, with its prefix.
run partial --nproc-per-node 2 sh -c 'printf "first\nno-newline-$RANK"; printf "err-$RANK" >&2'
expect_rc 0 "partial lines"
count partial.out "^\[rank ([01])\] no-newline-\1\$" 2
count partial.out "^\[rank [01]\] first\$" 2
count partial.err "^\[rank ([01])\] err-\1\$" 2

# Three ranks write long lines as fast as they can, in small pieces (printf
# writes each line with a separate write per part): every output line must
# still be one whole line of one rank.
run flood --nproc-per-node 3 sh -c \
  'i=0; while [ $i -lt 2000 ]; do printf "r$RANK %0200d" 0; printf " $i end\n"; i=$((i+1)); done'
expect_rc 0 "flood"
count flood.out . 6000
count flood.out "^\[rank ([0-2])\] r\1 0{200} [0-9]+ end\$" 6000

# A 3 MiB line without newline is split at 1 MiB, not buffered without bound.
run long sh -c 'head -c 3145728 /dev/zero | tr "\0" a'
expect_rc 0 "long line"
count long.out "^\[rank 0\] a+\$" 3
finish
