#!/usr/bin/env bash
# The goals of issue 63, measured: CPU per operation summed over every server process (etcd,
# the gateway, the nodes) of a cluster of 4 nodes with R=3 (so no node holds every PG), each
# with an S3 read endpoint, against `packrat serve` in the same run; 4 KiB objects, GETs at
# $CONC connections, batch GETs of 1,000 keys at 4 (per sample), PUTs at $CONC. Reads are
# measured through the gateway and client-routed (`packrat bench --direct`: straight to the
# node holding each key, as packrat_client reads). Both servers run side by side; each round
# runs every load on each in turn, the order alternating by round (whichever runs first in a
# pair tends to do better on this machine). Prints each round's CPU µs per op and the ratios to
# the embedded server, then their medians.
#
#   bench/direct.sh
#   ROUNDS=3 DURATION=10s KEYS=20000 bench/direct.sh
#   PACKRAT_BIN=target/release/packrat bench/direct.sh
set -eo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-20000}
DURATION=${DURATION:-10s}
CONC=${CONC:-64}
NODES=4
NODE_THREADS=${NODE_THREADS:-1}
AK=directbenchkey
SK=directbench-secret-0123456789
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 2; }
if [ -z "${PACKRAT_BIN:-}" ]; then cargo build -q -p packrat; fi
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
work=$(mktemp -d /tmp/packrat-direct-bench.XXXXXX)
results=$work/results.jsonl
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
export PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK

ready() { # url
  for _ in $(seq 1 150); do
    curl -fs "$1" >/dev/null 2>&1 && return
    sleep 0.2
  done
  echo "not ready: $1" >&2; exit 1
}
cpu() { # CPU seconds (user + system) of the given processes
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t $(getconf CLK_TCK)" | awk '{printf "%.3f", $1 / $2}'
}
run() { # round label endpoint "pids" bench-args...
  local round=$1 label=$2 endpoint=$3 procs=$4; shift 4
  local before after out
  before=$(cpu $procs)
  out=$(AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "$endpoint" \
    --label "$label" --json --keys "$KEYS" --duration "$DURATION" "$@")
  after=$(cpu $procs)
  python3 -c "
import json, sys
r = json.loads(sys.argv[1])
n = max(r.get('samples') or r['ops'], 1)
r['cpu_us_per_op'] = (float(sys.argv[3]) - float(sys.argv[2])) * 1e6 / n
r['round'] = int(sys.argv[4])
print(json.dumps(r))" "$out" "$before" "$after" "$round" >>"$results"
}

"$BIN" serve --data-dir "$work/embedded" --listen 127.0.0.1:19500 --log warn \
  --compact-interval 0 >"$work/embedded.log" 2>&1 &
serve_pid=$!
pids+=($serve_pid)

etcd_url=http://127.0.0.1:19579
etcd --name d --data-dir "$work/etcd" --listen-client-urls $etcd_url --advertise-client-urls $etcd_url \
  --listen-peer-urls http://127.0.0.1:19580 --initial-advertise-peer-urls http://127.0.0.1:19580 \
  --initial-cluster d=http://127.0.0.1:19580 --log-level error >"$work/etcd.log" 2>&1 &
etcd_pid=$!
pids+=($etcd_pid)
ready $etcd_url/health
"$BIN" cluster --etcd $etcd_url init --pgs 256 --replicas 3 >/dev/null
cluster_pids="$etcd_pid"
for i in $(seq 0 $((NODES - 1))); do
  "$BIN" node --etcd $etcd_url --data-dir "$work/node$i" --listen 127.0.0.1:$((19510 + i)) \
    --s3-listen 127.0.0.1:$((19530 + i)) --log warn --compact-interval 0 \
    --worker-threads "$NODE_THREADS" >"$work/node$i.log" 2>&1 &
  pids+=($!)
  cluster_pids="$cluster_pids $!"
done
for _ in $(seq 1 150); do
  "$BIN" cluster --etcd $etcd_url status 2>/dev/null | grep -q '"pgs_healthy": 256' && break
  sleep 0.2
done
"$BIN" gateway --etcd $etcd_url --listen 127.0.0.1:19520 --log warn >"$work/gateway.log" 2>&1 &
pids+=($!)
cluster_pids="$cluster_pids $!"
ready http://127.0.0.1:19500/health/ready
ready http://127.0.0.1:19520/health/ready
for e in http://127.0.0.1:19500 http://127.0.0.1:19520; do
  AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "$e" --workload get \
    --keys "$KEYS" --prepare --ops 1 --concurrency 16 >/dev/null
done

emb="http://127.0.0.1:19500"
node0=$(echo $cluster_pids | awk '{print $2}')
(AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint http://127.0.0.1:19520 --keys "$KEYS" --duration 12s --workload ${W:-get} ${BATCH:-} --concurrency ${C:-64} --direct --json > $work/out.json) &
sleep 2
perf record -F 999 -g -p $node0 -o /tmp/perf-node.data -- sleep 8 2>/dev/null
wait %1 || true
cat $work/out.json
