#!/usr/bin/env bash
# Instructions per 4 KiB request through a cluster, counted by callgrind: for each binary and
# workload, a fresh cluster on loopback (etcd, three nodes, one gateway, 256 PGs, R=3) with the
# gateway and the first node under callgrind, OPS requests counted at 4 connections after a
# warm-up. Repeatable to about 1%, where the CPU time of a cluster's PUT swings with the size
# of its group commits (see bench/cluster-ab.sh). The first node is head of a third of the
# PGs and a member of every one, so its count per request is an average over the chain's
# places. The load generator is B's `packrat bench`.
#
#   PACKRAT_A=/tmp/packrat-before PACKRAT_B=target/debug/packrat bench/cluster-instructions.sh
#   WORKLOADS=get OPS=2000 PACKRAT_A=... bench/cluster-instructions.sh
#   A_ENV=PACKRAT_INTERNAL_HTTP=1 PACKRAT_A=target/debug/packrat bench/cluster-instructions.sh
# A_ENV (and B_ENV) are set in the environment of that side's processes: with the one binary,
# the line above compares the internal API over HTTP (A) with its multiplexed connection (B).
set -euo pipefail
cd "$(dirname "$0")/.."
A=${PACKRAT_A:?the binary before a change}
B=${PACKRAT_B:-${CARGO_TARGET_DIR:-target}/debug/packrat}
WORKLOADS=${WORKLOADS:-"put get"}
OPS=${OPS:-1000}
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 2; }
export AWS_ACCESS_KEY_ID=clusterinstrkey AWS_SECRET_ACCESS_KEY=clusterinstr-secret-0123456789
export PACKRAT_ROOT_ACCESS_KEY=$AWS_ACCESS_KEY_ID PACKRAT_ROOT_SECRET_KEY=$AWS_SECRET_ACCESS_KEY
work=$(mktemp -d /tmp/packrat-cluster-instr.XXXXXX)
etcd_url=http://127.0.0.1:19579
gw_url=http://127.0.0.1:19520
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
trap 'stop_all; [ "${KEEP:-0}" = 1 ] || rm -rf "$work"' EXIT
wait_for() { # command...: retried for up to a minute
  for _ in $(seq 1 240); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
  echo "gave up waiting for: $*" >&2; exit 1
}
healthy() { "$1" cluster --etcd $etcd_url status | grep -q '"pgs_healthy": 256'; }
load() { # args...
  "$B" bench --endpoint $gw_url --bucket instr --size 4KiB --keys 500 --prefix k/ \
    --concurrency 4 --duration 3600s "$@" >/dev/null 2>&1
}
per_op() { # callgrind output: instructions per counted request
  callgrind_annotate --threshold=100 "$1" 2>/dev/null | awk -v n="$OPS" '/PROGRAM TOTALS/{gsub(",", "", $1); printf "%.0f", $1 / n}'
}

count() { # side binary workload
  local side=$1 bin=$2 w=$3 d=$work/$1-$3 node0 gw side_env
  side_env=$( [ "$side" = A ] && echo "${A_ENV:-}" || echo "${B_ENV:-}" )
  # shellcheck disable=SC2086 # the side's settings, as words
  [ -n "$side_env" ] && export $side_env
  mkdir -p "$d"
  etcd --name b --data-dir "$d/etcd" --listen-client-urls $etcd_url --advertise-client-urls $etcd_url \
    --listen-peer-urls http://127.0.0.1:19580 --initial-advertise-peer-urls http://127.0.0.1:19580 \
    --initial-cluster b=http://127.0.0.1:19580 --log-level error >"$d/etcd.log" 2>&1 &
  pids+=($!)
  wait_for curl -fs $etcd_url/health
  "$bin" cluster --etcd $etcd_url init --pgs 256 --replicas 3 >/dev/null
  for i in 0 1 2; do
    local pre=()
    [ "$i" = 0 ] && pre=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$d/node0.out")
    "${pre[@]}" "$bin" node --etcd $etcd_url --data-dir "$d/node$i" --listen 127.0.0.1:$((19510 + i)) \
      --log warn --compact-interval 0 >"$d/node$i.log" 2>&1 &
    pids+=($!)
    [ "$i" = 0 ] && node0=$!
  done
  wait_for healthy "$bin"
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$d/gateway.out" \
    "$bin" gateway --etcd $etcd_url --listen 127.0.0.1:19520 --log warn >"$d/gateway.log" 2>&1 &
  gw=$!
  pids+=($gw)
  wait_for curl -fs $gw_url/health/ready
  load --workload put --prepare --ops 0
  load --workload "$w" --ops 300
  callgrind_control -i on "$gw" "$node0" >/dev/null 2>&1
  load --workload "$w" --ops "$OPS"
  callgrind_control -i off "$gw" "$node0" >/dev/null 2>&1
  callgrind_control -d "$gw" "$node0" >/dev/null 2>&1
  stop_all
  # shellcheck disable=SC2086
  [ -n "$side_env" ] && unset ${side_env%%=*}
  echo "$w $side: gateway $(per_op "$d/gateway.out.1"), first node $(per_op "$d/node0.out.1") instructions per request"
}

for w in $WORKLOADS; do
  count A "$A" "$w"
  count B "$B" "$w"
done
