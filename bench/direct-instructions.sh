#!/usr/bin/env bash
# Instructions per client-routed read, counted by callgrind: what a storage node's S3 read
# endpoint spends on a 4 KiB GET sent straight to it (`packrat bench --direct`), against what
# `packrat serve` spends on the same request, in the same run. A cluster of etcd, 4 nodes with R=3 (each with --s3-listen) and a gateway, the first
# node under callgrind; its requests are the run's less the other nodes' (their read endpoints'
# /metrics: a process under valgrind cannot render its own, procfs's auxv probe faults there),
# so its instructions (background work included) are divided by what it served. Repeatable to about
# 1%, where CPU time on this machine swings by half from run to run (bench/direct.sh).
#
#   bench/direct-instructions.sh
#   OPS=4000 bench/direct-instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
WORKLOADS=get
OPS=${OPS:-2000}
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 2; }
[ -n "${PACKRAT_BIN:-}" ] || cargo build -q -p packrat
export AWS_ACCESS_KEY_ID=directinstrkey AWS_SECRET_ACCESS_KEY=directinstr-secret-0123456789
export PACKRAT_ROOT_ACCESS_KEY=$AWS_ACCESS_KEY_ID PACKRAT_ROOT_SECRET_KEY=$AWS_SECRET_ACCESS_KEY
work=$(mktemp -d /tmp/packrat-direct-instr.XXXXXX)
etcd_url=http://127.0.0.1:19679
gw_url=http://127.0.0.1:19620
emb_url=http://127.0.0.1:19600
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
healthy() { # every PG caught up on 3 of the 4 nodes (the node under valgrind starts last)
  "$BIN" cluster --etcd $etcd_url status |
    python3 -c 'import json, sys; s = json.load(sys.stdin); sys.exit(not (s["pgs_healthy"] == 256 and len(s["nodes"]) == 4))'
}
per_run() { # callgrind output: its instructions
  callgrind_annotate --threshold=100 "$1" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",", "", $1); print $1}'
}
served() { # GETs the read endpoints of nodes 1 to 3 answered
  local n=0 i
  for i in 1 2 3; do
    n=$((n + $(curl -fs "http://127.0.0.1:$((19630 + i))/metrics" |
      awk '/^packrat_requests_total/ && /op="GetObject"/ {n += $2} END {printf "%d", n}')))
  done
  echo "$n"
}
args_of() { # workload: the bench's arguments
  echo "--workload $1"
}
load() { # endpoint args...
  "$BIN" bench --endpoint "$1" --bucket instr --size 4KiB --keys 2000 --prefix k/ \
    --concurrency 4 --duration 3600s "${@:2}" >/dev/null 2>&1
}

# The embedded server, under callgrind.
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/embedded.out" \
  "$BIN" serve --data-dir "$work/embedded" --listen 127.0.0.1:19600 --log warn --compact-interval 0 \
  --no-access-log >"$work/embedded.log" 2>&1 &
emb=$!
pids+=($emb)
wait_for curl -fs $emb_url/health/ready
load $emb_url --workload put --prepare --ops 0
declare -A emb_per
for w in $WORKLOADS; do
  # shellcheck disable=SC2046
  load $emb_url $(args_of "$w") --ops 200
  callgrind_control -z "$emb" >/dev/null 2>&1 || true
  callgrind_control -i on "$emb" >/dev/null 2>&1
  # shellcheck disable=SC2046
  load $emb_url $(args_of "$w") --ops "$OPS"
  callgrind_control -i off "$emb" >/dev/null 2>&1
  callgrind_control -d "$emb" >/dev/null 2>&1
  out=$(ls -t "$work"/embedded.out.* | head -1)
  emb_per[$w]=$(( $(per_run "$out") / OPS ))
done
stop_all

# The cluster: the first node under callgrind.
etcd --name d --data-dir "$work/etcd" --listen-client-urls $etcd_url --advertise-client-urls $etcd_url \
  --listen-peer-urls http://127.0.0.1:19680 --initial-advertise-peer-urls http://127.0.0.1:19680 \
  --initial-cluster d=http://127.0.0.1:19680 --log-level error >"$work/etcd.log" 2>&1 &
pids+=($!)
wait_for curl -fs $etcd_url/health
"$BIN" cluster --etcd $etcd_url init --pgs 256 --replicas 3 >/dev/null
for i in 0 1 2 3; do
  pre=()
  [ "$i" = 0 ] && pre=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/node0.out")
  "${pre[@]}" "$BIN" node --etcd $etcd_url --data-dir "$work/node$i" --listen 127.0.0.1:$((19610 + i)) \
    --s3-listen 127.0.0.1:$((19630 + i)) --log warn --compact-interval 0 >"$work/node$i.log" 2>&1 &
  pids+=($!)
  [ "$i" = 0 ] && node0=$!
done
wait_for healthy
"$BIN" gateway --etcd $etcd_url --listen 127.0.0.1:19620 --log warn >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_for curl -fs $gw_url/health/ready
load $gw_url --workload put --prepare --ops 0
for w in $WORKLOADS; do
  # shellcheck disable=SC2046
  load $gw_url $(args_of "$w") --direct --ops 200
  callgrind_control -z "$node0" >/dev/null 2>&1 || true
  before=$(served)
  callgrind_control -i on "$node0" >/dev/null 2>&1
  # shellcheck disable=SC2046
  load $gw_url $(args_of "$w") --direct --ops "$OPS"
  callgrind_control -i off "$node0" >/dev/null 2>&1
  after=$(served)
  callgrind_control -d "$node0" >/dev/null 2>&1
  out=$(ls -t "$work"/node0.out.* | head -1)
  n=$((OPS - (after - before)))
  node_per=$(( $(per_run "$out") / (n > 0 ? n : 1) ))
  echo "$w: instructions per 4 KiB GET: packrat serve ${emb_per[$w]}, a node's read endpoint $node_per ($n of $OPS requests were the first node's); ratio $(awk -v a="$node_per" -v b="${emb_per[$w]}" 'BEGIN{printf "%.2f", a / b}')"
done
