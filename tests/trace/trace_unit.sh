# The recorder's unit test, then its small nested trace through check_trace.py.
# Usage: trace_unit.sh test_trace check_trace.py python3
set -u
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$1" "$T/unit.json" || exit 1
"$3" "$2" "$T/unit.json" --ranks 1 --expect forward,backward,allreduce,"bucket ready" \
  --inside forward:backward || exit 1
echo ok
