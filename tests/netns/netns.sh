#!/bin/bash
# Two "hosts" on one machine (issue #17 item 6): network namespaces A and B,
# each joined by a veth pair to a bridge in a third namespace S (the
# switch; 10.77.0.1 and 10.77.0.2), each with its own
# hostname (a UTS namespace: dgrad tells hosts apart by name), 2 ranks per
# host, each host's ranks started by its own `dgrun --nnodes 2 --node-rank
# i`, MASTER_ADDR=10.77.0.1 (host A). Host B also has an interface that
# host A cannot reach (10.79.0.2, listed before the link by getifaddrs):
# ranks that listened there could not be reached, so the run passing shows
# that the address comes from the route to MASTER_ADDR (the log line says
# so too).
#
#   netns.sh exact  WORKER DGRUN   the losses of every step equal those of
#                                  the same layout on one host (two dgruns
#                                  in namespace A, DG_HOST_ID=A and B: the
#                                  same hierarchical allreduce), bit for
#                                  bit; each host's ranks share memory
#   netns.sh netem  WORKER DGRUN   with `tc netem` delay 5 ms +- 2 ms and 2%
#                                  loss on both ends of the link (a kernel
#                                  without netem: tbf at 4 Mbit/s with a
#                                  queue shorter than TCP's bursts, for
#                                  queueing delay and tail drops): the same
#                                  losses bit for bit, and the link dropped
#                                  packets that TCP retransmitted
#   netns.sh cut    WORKER DGRUN   host A's port on the switch set down
#                                  mid-run (A's link loses its carrier; both
#                                  hosts keep their addresses, so ranks on
#                                  one host still reach each other): every
#                                  rank fails within the group timeout
#                                  (3 s; 0.5 s more for the exits),
#                                  each naming a rank on the other host;
#                                  both dgruns exit non-zero
#
# Skips (77) where network namespaces cannot be created (not root, no
# CAP_SYS_ADMIN). Names are unique per run; namespaces, links and processes
# are removed on every exit path.
set -u
mode="${1:?usage: netns.sh exact|netem|cut WORKER DGRUN}"
worker="$(readlink -f "${2:?usage: netns.sh MODE WORKER DGRUN}")"
dgrun="$(readlink -f "${3:?usage: netns.sh MODE WORKER DGRUN}")"
id="$(printf '%x%x' $$ $((RANDOM % 16)))"
nsa="dgA_$id" nsb="dgB_$id" nss="dgS_$id"
va="vA$id" vb="vB$id" sa="sA$id" sb="sB$id" vx="vX$id" vy="vY$id"
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for n in "$nsa" "$nsb" "$nss"; do # any process left in the namespace
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  wait 2>/dev/null
  ip netns del "$nsa" 2>/dev/null
  ip netns del "$nsb" 2>/dev/null
  ip netns del "$nss" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.out; do [ -f "$f" ] && { echo "---- $f" >&2; tail -40 "$f" >&2; }; done
  exit 1
}

if ! ip netns add "$nsa" 2>"$tmp/why"; then
  echo "SKIP: cannot create a network namespace: $(cat "$tmp/why")"
  exit 77
fi
ip netns add "$nsb" || fail "ip netns add $nsb"
ip netns add "$nss" || fail "ip netns add $nss"
A() { ip netns exec "$nsa" "$@"; }
B() { ip netns exec "$nsb" "$@"; }
S() { ip netns exec "$nss" "$@"; }
# the unreachable interface first, so getifaddrs lists it before the link
ip link add "$vx" netns "$nsb" type veth peer name "$vy" netns "$nsb" || fail "veth in B"
ip link add "$va" netns "$nsa" type veth peer name "$sa" netns "$nss" || fail "veth A-S"
ip link add "$vb" netns "$nsb" type veth peer name "$sb" netns "$nss" || fail "veth B-S"
S ip link add br0 type bridge && S ip link set "$sa" master br0 &&
  S ip link set "$sb" master br0 && S ip link set br0 up && S ip link set "$sa" up &&
  S ip link set "$sb" up || fail "the switch"
A ip link set lo up && B ip link set lo up &&
  A ip addr add 10.77.0.1/24 dev "$va" && A ip link set "$va" up &&
  B ip addr add 10.77.0.2/24 dev "$vb" && B ip link set "$vb" up &&
  B ip addr add 10.79.0.2/24 dev "$vx" && B ip link set "$vx" up &&
  B ip link set "$vy" up || fail "addresses"

shaper=""
if [ "$mode" = netem ]; then
  shaper=netem
  A tc qdisc add dev "$va" root netem delay 5ms 2ms loss 2% 2>"$tmp/why" || shaper=tbf
  # A kernel without netem (minimal VM kernels have none): a token bucket at
  # 4 Mbit/s whose queue (6 KB) is shorter than TCP's bursts gives the link
  # queueing delay and tail drops instead; the drops and TCP's
  # retransmissions are counted below, so the test shows the loss happened.
  [ "$shaper" = tbf ] && { A tc qdisc add dev "$va" root tbf rate 4mbit burst 4kb limit 6kb \
    2>>"$tmp/why" || { echo "SKIP: neither tc netem nor tbf here: $(cat "$tmp/why")"; exit 77; }; }
  if [ "$shaper" = netem ]; then
    B tc qdisc add dev "$vb" root netem delay 5ms 2ms loss 2% || fail "netem on B"
  else
    B tc qdisc add dev "$vb" root tbf rate 4mbit burst 4kb limit 6kb || fail "tbf on B"
  fi
fi

steps=40
timeout_ms=3000
[ "$mode" = cut ] && steps=1000000
wargs=(--steps "$steps" --timeout-ms "$timeout_ms")
[ "$mode" = cut ] && wargs+=(--sleep-ms 2)

# host NS HOSTNAME NODE_RANK OUT: dgrun for one host in the background
host() {
  ip netns exec "$1" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$2" \
    env DG_LOG=info "$dgrun" --nnodes 2 --node-rank "$3" --nproc-per-node 2 \
    --master-addr 10.77.0.1 --master-port 29500 --grace-seconds 10 -- \
    "$worker" "${wargs[@]}" >"$4" 2>&1 &
  pids+=($!)
}
host "$nsa" dghosta 0 "$tmp/a.out"
host "$nsb" dghostb 1 "$tmp/b.out"
pa=${pids[0]} pb=${pids[1]}

if [ "$mode" = cut ]; then
  # wait for training, then cut the link
  for _ in $(seq 1 600); do
    grep -q '^\[rank 0\] step 20 loss' "$tmp/a.out" && break
    sleep 0.1
  done
  grep -q '^\[rank 0\] step 20 loss' "$tmp/a.out" || fail "training did not start"
  t0=$(date +%s.%N)
  S ip link set "$sa" down || fail "cutting the link"
  # every rank must fail: dgrun exits once its ranks have (bounded wait)
  for p in "$pa" "$pb"; do
    for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && fail "dgrun $p still running 30 s after the cut"
  done
  wait "$pa"; ra=$?
  wait "$pb"; rb=$?
  [ "$ra" -ne 0 ] && [ "$rb" -ne 0 ] || fail "dgrun exit statuses $ra, $rb after the cut"
  # each rank's error line, when it came: "[rank R] ddp_worker: rank R: step S: msg"
  for r in 0 1 2 3; do
    f="$tmp/a.out"; other="[23]"
    [ "$r" -ge 2 ] && f="$tmp/b.out" && other="[01]"
    line=$(grep -m1 "^\[rank $r\] ddp_worker: rank $r: step" "$f") ||
      fail "rank $r printed no failure"
    echo "$line" | sed 's/^\[rank [0-9]\] ddp_worker: rank [0-9]: step [0-9]*: //' |
      grep -Eq "rank $other\b" || fail "rank $r's message names no rank of the other host: $line"
    echo "rank $r: $line"
  done
  # the time: from the cut to the last dgrun's exit (its ranks failed before)
  t1=$(date +%s.%N)
  el=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  # (the ranks take no notice of dgrun's SIGTERM: only their own failing ends
  # them before dgrun's SIGKILL, 10 s later). A connection fails once data
  # or a keepalive probe goes unanswered for half the timeout; the flight
  # recorder's summary then asks the store for at most an eighth of it
  # (host B's ranks cannot reach it): 2.4-2.7 s here. The bound is the
  # timeout plus 0.5 s for the processes' exit and this loop's polling.
  awk -v e="$el" -v t="$timeout_ms" 'BEGIN { exit !(e < t / 1000 + 0.5) }' ||
    fail "ranks took $el s to fail after the cut"
  echo "ok: every rank failed after the cut (both dgruns gone $el s after it), naming the other host"
  exit 0
fi

for p in "$pa" "$pb"; do
  for _ in $(seq 1 1200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "dgrun $p still running after 120 s"
done
wait "$pa" || fail "host A's dgrun exited $?"
wait "$pb" || fail "host B's dgrun exited $?"
for r in 2 3; do
  grep -q "^\[rank $r\] .*rank $r listens on 10.77.0.2:[0-9]* (route to 10.77.0.1)" "$tmp/b.out" ||
    fail "rank $r does not report listening on 10.77.0.2 by the route to MASTER_ADDR"
done

# inside each host the ranks share memory (the hierarchical allreduce)
for f in a b; do
  [ "$(grep -c 'hierarchical allreduce: host .* inside the host: shared memory' "$tmp/$f.out")" -eq 2 ] ||
    fail "host $f's ranks do not report the hierarchical allreduce over shared memory"
done
# the reference: the same layout on one host (namespace A, loopback), two
# "hosts" told apart by DG_HOST_ID, so the summation order is the same
ref() {
  A env DG_LOG=info DG_HOST_ID="$1" timeout 120 "$dgrun" --nnodes 2 --node-rank "$2" \
    --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29500 -- \
    "$worker" "${wargs[@]}" >"$3" 2>&1
}
ref A 0 "$tmp/one.out" & r0=$!
ref B 1 "$tmp/one_b.out" & r1=$!
wait "$r0" || fail "the one-host run (DG_HOST_ID=A) exited $?"
wait "$r1" || fail "the one-host run (DG_HOST_ID=B) exited $?"
grep -q 'host identity "B" from opts.host_id / DG_HOST_ID' "$tmp/one_b.out" ||
  fail "the one-host run does not log DG_HOST_ID"
grep '^\[rank 0\] step .* loss' "$tmp/one.out" >"$tmp/one.l"
grep '^\[rank 0\] step .* loss' "$tmp/a.out" >"$tmp/two.l"
[ "$(wc -l <"$tmp/one.l")" -eq "$steps" ] || fail "the one-host run printed $(wc -l <"$tmp/one.l") losses"
cmp -s "$tmp/one.l" "$tmp/two.l" || { diff "$tmp/one.l" "$tmp/two.l" | head >&2; fail "losses differ"; }
if [ "$mode" = netem ]; then
  drops=0 retrans=0
  for side in "A $va" "B $vb"; do
    set -- $side
    d=$($1 tc -s qdisc show dev "$2" | grep -o 'dropped [0-9]*' | head -1 | cut -d' ' -f2)
    r=$($1 nstat -asz TcpRetransSegs | awk '/TcpRetransSegs/ { print $2 }')
    drops=$((drops + ${d:-0})) retrans=$((retrans + ${r:-0}))
  done
  echo "$shaper: $drops packets dropped on the link, $retrans TCP segments retransmitted"
  [ "$drops" -gt 0 ] && [ "$retrans" -gt 0 ] || fail "the $shaper link lost nothing: the test proves nothing"
fi
echo "ok ($mode): $steps losses of 2 hosts x 2 ranks equal the one-host run's bit for bit" \
  "(last: $(tail -1 "$tmp/two.l"))"
