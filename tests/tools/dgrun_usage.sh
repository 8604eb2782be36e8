# dgrun: usage errors exit 2 with a clear message; --help documents the rest.
. "$(dirname "$0")/lib.sh"

run help --help
expect_rc 0 "--help"
has help.out "^usage: dgrun "
has help.out '\[rank R\] line'
has help.out "DG_RESTART_COUNT"
count help.err . 0

# usage_error NAME PATTERN ARGS...: exit 2, PATTERN on stderr, nothing run.
usage_error() {
  name=$1; pattern=$2; shift 2
  run "$name" "$@"
  expect_rc 2 "$name"
  has "$name.err" "$pattern"
  has "$name.err" "Try 'dgrun --help'"
  count "$name.out" . 0
}
usage_error noprog "no program given"
usage_error noprog2 "no program given" --nproc-per-node 2
usage_error unknown "unknown option '--frobnicate'" --frobnicate 1 true
usage_error short "unknown option '-x'" -x true
usage_error nan "--nproc-per-node: expected an integer" --nproc-per-node two true
usage_error zero "--nproc-per-node: expected an integer in \[1," --nproc-per-node 0 true
usage_error trailing "--nproc-per-node: expected an integer" --nproc-per-node 2x true
usage_error novalue "--max-restarts needs a value" --max-restarts
usage_error port "--master-port: expected an integer in \[0, 65535\]" --master-port 70000 true
usage_error grace "--grace-seconds: expected seconds" --grace-seconds -1 true
usage_error noderank "--node-rank 2 must be less than --nnodes 2" --nnodes 2 --node-rank 2 --master-port 1 true
usage_error multiport "--master-port is required when --nnodes > 1" --nnodes 2 true

# Options after the program belong to the program.
run passthrough sh -c 'echo "$1 $2"' sh --nproc-per-node 5
expect_rc 0 "program arguments"
count passthrough.out "^\[rank 0\] --nproc-per-node 5\$" 1
finish
