#!/usr/bin/env bash
# test/two_hosts.sh [PEER [ROLLOUT]] — the two-host test: a producer and a consumer in
# two network namespaces joined by a veth pair (10.77.0.1/24 <-> 10.77.0.2/24,
# addresses that exist only inside those namespaces), optionally impaired
# with tc netem (delay, loss, reordering). Each run streams blobs through a
# resend session over that path, as between two machines, and checks that
# every blob arrives exactly once and byte-identical.
#
#   bazel/bazelw test //test:two_hosts_test        # as CI runs it (root)
#   sudo test/two_hosts.sh bazel-bin/test/two_host_peer bazel-bin/examples/rollout_to_trainer
#
# Runs:  plain veth; veth with the connection cut 5 times (resend); the
#        main job at cluster shape (ROLLOUT, examples/rollout_to_trainer):
#        4 workers in $a routing GRPO groups to 2 trainer ranks in $b, one
#        process per rank listening on 10.77.0.2, each checking its exact
#        share; netem delay 2ms+-1ms, loss 1%, reorder 10% on both ends
#        (needs the sch_netem kernel module), with cuts.
# Needs root, iproute2 and network namespaces; when any is missing it says
# why and exits 0 (skipped). Each skip, of the whole test or of one run,
# prints `SKIPPED: <target> <run>: <reason>` (.ci/run counts them); a skip
# of the whole test adds `ALL SKIPPED: <target>: every run`.
set -uo pipefail

peer=${1:-${BLOBPIPE_TWO_HOST_PEER:-}}
if [[ -z $peer ]]; then
  for p in bazel-bin/test/two_host_peer "$(dirname "$0")/two_host_peer"; do
    [[ -x $p ]] && peer=$p && break
  done
fi
[[ -n $peer && -x $peer ]] || { echo "two_hosts: no two_host_peer binary (pass its path)" >&2; exit 2; }
peer=$(cd "$(dirname "$peer")" && pwd)/$(basename "$peer")
rollout=${2:-${BLOBPIPE_TWO_HOST_ROLLOUT:-}}
if [[ -z $rollout ]]; then
  for p in bazel-bin/examples/rollout_to_trainer "$(dirname "$0")/../examples/rollout_to_trainer"; do
    [[ -x $p ]] && rollout=$p && break
  done
fi
[[ -n $rollout && -x $rollout ]] && rollout=$(cd "$(dirname "$rollout")" && pwd)/$(basename "$rollout")

target=${TEST_TARGET:-two_hosts.sh}
skipped() { echo "SKIPPED: $target $1: $2"; }    # RUN REASON
skip() {  # REASON: the whole test, which .ci/run then counts as skipped
  skipped "(every run)" "$*"
  echo "ALL SKIPPED: $target: every run"
  exit 0
}
PATH=$PATH:/usr/sbin:/sbin
[[ $(id -u) -eq 0 ]] || skip "two_hosts needs root (network namespaces); run as root or with sudo"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"

blobs=${BLOBPIPE_TWO_HOST_BLOBS:-3000}
tag=bp$$
a=${tag}a b=${tag}b
cleanup() {
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
}
trap cleanup EXIT

ip netns add "$a" 2>/tmp/two_hosts.$$ || skip "ip netns add failed: $(cat /tmp/two_hosts.$$)"
rm -f /tmp/two_hosts.$$
ip netns add "$b" || skip "ip netns add failed"
ip link add "${tag}va" type veth peer name "${tag}vb" || skip "cannot create a veth pair"
ip link set "${tag}va" netns "$a"
ip link set "${tag}vb" netns "$b"
ip -n "$a" addr add 10.77.0.1/24 dev "${tag}va"
ip -n "$b" addr add 10.77.0.2/24 dev "${tag}vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${tag}va" up
ip -n "$b" link set "${tag}vb" up

failures=0
port=7700

# One stream: consumer on 10.77.0.2 in $b, producer in $a connecting to it.
run() {
  local name=$1 kills=$2
  port=$((port + 1))
  echo "== $name ($blobs blobs, $kills cuts)"
  local out
  out=$(mktemp -d)
  mkfifo "$out/ready"
  ip netns exec "$b" "$peer" consume 10.77.0.2 "$port" "$blobs" >"$out/ready" 2>"$out/c.err" &
  local cpid=$!
  # Wait for "ready" (the consumer is listening): a blocking read on the
  # consumer's stdout, no sleep. fd 3 stays open for the rest of it.
  exec 3<"$out/ready"
  local line=""
  read -r line <&3 || true
  if [[ $line != ready ]]; then
    echo "FAILED: $name: consumer did not start: $(cat "$out/c.err")"
    failures=$((failures + 1))
    wait "$cpid" 2>/dev/null
    exec 3<&-
    return
  fi
  cat <&3 >"$out/c.out" &
  local catpid=$!
  exec 3<&-
  ip netns exec "$a" "$peer" produce 10.77.0.2 "$port" "$blobs" "$kills" >"$out/p.out" 2>"$out/p.err"
  local prc=$?
  wait "$cpid"
  local crc=$?
  wait "$catpid"
  cat "$out/p.out" "$out/c.out"
  if [[ $prc -ne 0 || $crc -ne 0 ]]; then
    echo "FAILED: $name (producer $prc, consumer $crc)"
    cat "$out/p.err" "$out/c.err"
    failures=$((failures + 1))
  else
    echo "PASSED: $name"
  fi
  rm -rf "$out"
}

# The cluster-shaped main job: 2 rank processes in $b on 10.77.0.2, one
# worker process (4 workers, each a router to both ranks) in $a. Each rank
# exits 0 only with exactly its share, byte for byte, and all its groups.
cluster() {
  local name="cluster: 4 workers in $a -> 2 ranks in $b"
  local common=(--workers 4 --batch 256 --group-size 4 --seq-len 512 --timeout 120)
  echo "== $name"
  if [[ -z $rollout || ! -x $rollout ]]; then
    skipped "cluster run" "no rollout_to_trainer binary (pass its path as the second argument)"
    return
  fi
  local out urls="" k pids=() cats=() rcs=() line
  out=$(mktemp -d)
  for k in 0 1; do
    port=$((port + 1))
    mkfifo "$out/ready$k"
    ip netns exec "$b" "$rollout" --listen "tcp://10.77.0.2:$port" --rank "$k" --trainers 2 \
      "${common[@]}" >"$out/ready$k" 2>"$out/r$k.err" &
    pids+=($!)
    # The first line names the URL once the rank listens (no sleep).
    exec 3<"$out/ready$k"
    line=""
    read -r line <&3 || true
    echo "$line" >"$out/r$k.out"
    cat <&3 >>"$out/r$k.out" &
    cats+=($!)
    exec 3<&-
    urls+="${urls:+,}tcp://10.77.0.2:$port"
  done
  ip netns exec "$a" "$rollout" --connect "$urls" "${common[@]}" >"$out/w.out" 2>"$out/w.err"
  local wrc=$?
  for k in 0 1; do
    wait "${pids[$k]}"
    rcs+=($?)
    wait "${cats[$k]}"
  done
  cat "$out/w.out" "$out/r0.out" "$out/r1.out"
  if [[ $wrc -ne 0 || ${rcs[0]} -ne 0 || ${rcs[1]} -ne 0 ]]; then
    echo "FAILED: $name (workers $wrc, rank 0 ${rcs[0]}, rank 1 ${rcs[1]})"
    cat "$out/w.err" "$out/r0.err" "$out/r1.err"
    failures=$((failures + 1))
  else
    echo "PASSED: $name"
  fi
  rm -rf "$out"
}

run "veth" 0
run "veth, connection cut 5 times" 5
cluster

netem_ok=1
for pair in "$a ${tag}va" "$b ${tag}vb"; do
  set -- $pair
  if ! err=$(ip netns exec "$1" tc qdisc add dev "$2" root netem delay 2ms 1ms loss 1% reorder 10% 50% 2>&1); then
    netem_ok=0
    break
  fi
done
if [[ $netem_ok -eq 1 ]]; then
  run "netem delay 2ms+-1ms, loss 1%, reorder 10%, cut 3 times" 3
elif ! command -v tc >/dev/null; then
  skipped "netem run" "tc (iproute2) is not installed"
else
  skipped "netem run" "tc cannot add a netem qdisc here (${err:-?}); the kernel needs sch_netem (modprobe sch_netem)"
fi

echo "two_hosts: $failures failed"
[[ $failures -eq 0 ]]
