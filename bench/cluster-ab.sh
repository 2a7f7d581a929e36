#!/usr/bin/env bash
# Loads through a cluster, two binaries alternating: for each round and each binary, a fresh
# cluster on loopback (etcd, three nodes, one gateway, 256 PGs, R=3), one load for $DURATION
# at $CONC connections: PUTs of $SIZE (4 KiB), (WORKLOAD=get) GETs of the keys the round wrote
# first, (WORKLOAD=batch) batch GETs of 1,000 of those keys (counted per sample: ops/s are
# samples/s), or (WORKLOAD=multipart) uploads of 32 MiB in 8 MiB parts. Odd rounds run A first, even
# rounds B first: whichever runs first in a pair tends to do better. On the 2-core machine
# of docs/benchmark-log.md, multipart loads cost up to twice the CPU per MiB in the second and
# third runs of four, whatever the binary (its page-cache writes swing so): compare runs in
# the same places, or swap A and B and run again.
# Prints ops/s, MB/s, median and p99 latency, the CPU of the gateway and the nodes per
# operation (and per MiB, and per process), the writes per group commit on the first node,
# and the gathered lookups and relayed writes the gateway and nodes count.
#
#   PACKRAT_A=/tmp/packrat-A PACKRAT_B=/tmp/packrat-B CONC=4 ROUNDS=4 bench/cluster-ab.sh
#   PACKRAT_A=... PACKRAT_B=... SIZE=64KiB bench/cluster-ab.sh
#   PACKRAT_A=... PACKRAT_B=... WORKLOAD=get SIZE=4MiB KEYS=200 CONC=4 bench/cluster-ab.sh
#   PACKRAT_A=... PACKRAT_B=... WORKLOAD=batch SIZE=64KiB KEYS=5000 CONC=4 bench/cluster-ab.sh
#   PACKRAT_A=... PACKRAT_B=... WORKLOAD=multipart CONC=2 bench/cluster-ab.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PACKRAT_A:?the binary A}" "${PACKRAT_B:?the binary B}"
CONC=${CONC:-64}
WORKLOAD=${WORKLOAD:-put}
SIZE=${SIZE:-4KiB}
case $WORKLOAD in
  put) args=(--workload put --size "$SIZE") ;;
  get) args=(--workload get --size "$SIZE") ;;
  batch) args=(--workload batch --size "$SIZE" --batch-size 1000 --batch-order request) ;;
  multipart) args=(--workload multipart --size 32MiB --part-size 8MiB --prefix mp/) ;;
  *) echo "WORKLOAD is put, get, batch or multipart" >&2; exit 2 ;;
esac
ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-15s}
KEYS=${KEYS:-20000}
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 2; }
export AWS_ACCESS_KEY_ID=clusterbenchkey AWS_SECRET_ACCESS_KEY=clusterbench-secret-0123456789
export PACKRAT_ROOT_ACCESS_KEY=$AWS_ACCESS_KEY_ID PACKRAT_ROOT_SECRET_KEY=$AWS_SECRET_ACCESS_KEY
work=$(mktemp -d /tmp/packrat-cluster-put-ab.XXXXXX)
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT
ready() {
  for _ in $(seq 1 150); do curl -fs "$1" >/dev/null 2>&1 && return; sleep 0.2; done
  echo "not ready: $1" >&2; exit 1
}
cpu() { # CPU seconds of the given processes
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t $(getconf CLK_TCK)" | awk '{printf "%.3f", $1 / $2}'
}
groups() { # group commits and writes committed on the first node
  curl -s http://127.0.0.1:19410/metrics |
    awk '/^packrat_commit_batches_total/{b=$2} /^packrat_commit_jobs_total/{j=$2} END{print b, j}'
}
one() { # label binary
  local bin=$2 etcd_url=http://127.0.0.1:19479 d
  d=$work/$1; rm -rf "$d"; mkdir -p "$d"
  etcd --name b --data-dir "$d/etcd" --listen-client-urls $etcd_url --advertise-client-urls $etcd_url \
    --listen-peer-urls http://127.0.0.1:19480 --initial-advertise-peer-urls http://127.0.0.1:19480 \
    --initial-cluster b=http://127.0.0.1:19480 --log-level error >"$d/etcd.log" 2>&1 &
  pids+=($!)
  ready $etcd_url/health
  "$bin" cluster --etcd $etcd_url init --pgs 256 --replicas 3 >/dev/null
  local servers=()
  for i in 0 1 2; do
    "$bin" node --etcd $etcd_url --data-dir "$d/node$i" --listen 127.0.0.1:$((19410 + i)) \
      --log warn --compact-interval 0 >"$d/node$i.log" 2>&1 &
    pids+=($!); servers+=($!)
  done
  for _ in $(seq 1 150); do
    "$bin" cluster --etcd $etcd_url status 2>/dev/null | grep -q '"pgs_healthy": 256' && break
    sleep 0.2
  done
  "$bin" gateway --etcd $etcd_url --listen 127.0.0.1:19420 --log warn >"$d/gateway.log" 2>&1 &
  pids+=($!); servers+=($!)
  ready http://127.0.0.1:19420/health/ready
  "$bin" bench --endpoint http://127.0.0.1:19420 --workload get --keys "$KEYS" --prepare --ops 1 \
    --size "$SIZE" --concurrency 8 >/dev/null 2>&1
  local c0 c1 g0 g1 out p per0=() per=""
  g0=$(groups); c0=$(cpu "${servers[@]}")
  for p in "${servers[@]}"; do per0+=("$(cpu "$p")"); done
  out=$("$bin" bench --endpoint http://127.0.0.1:19420 --json "${args[@]}" --keys "$KEYS" \
    --concurrency "$CONC" --duration "$DURATION")
  c1=$(cpu "${servers[@]}"); g1=$(groups)
  for i in "${!servers[@]}"; do per+="$(cpu "${servers[$i]}") ${per0[$i]} "; done
  python3 -c "
import json, sys
r = json.loads(sys.argv[2])
if r.get('samples'):  # a batch GET: per sample
    r['ops'], r['ops_per_sec'] = r['samples'], r['samples_per_sec']
b0, j0 = map(float, sys.argv[5].split()); b1, j1 = map(float, sys.argv[6].split())
us = (float(sys.argv[4]) - float(sys.argv[3])) * 1e6 / max(r['ops'], 1)
mib = r.get('size_bytes', 4096) / (1 << 20)
print(f\"{sys.argv[1]}  {r['ops_per_sec']:8.1f} ops/s  {r.get('mb_per_sec', 0):6.1f} MB/s  \"
      f\"p50 {r['latency_us_p50'] / 1000:7.2f} ms  p99 {r['latency_us_p99'] / 1000:7.2f} ms  \"
      f\"{us:8.0f} CPU us/op  {us / mib / 1000:6.2f} CPU ms/MiB  \"
      f\"{(j1 - j0) / max(b1 - b0, 1):5.2f} writes/group  errors {r['errors']}\")
t = list(map(float, sys.argv[7].split()))
names = ['node0', 'node1', 'node2', 'gateway']
print('   CPU us/op ' + '  '.join(f'{n} {(t[2 * i] - t[2 * i + 1]) * 1e6 / max(r[\"ops\"], 1):.0f}' for i, n in enumerate(names)))
" "$1" "$out" "$c0" "$c1" "$g0" "$g1" "$per"
  # How many requests went gathered (lookups) or relayed (writes, chain steps), and in how many.
  echo "   gateway: $(curl -s http://127.0.0.1:19420/metrics |
    awk '/^packrat_cluster_(lookups_gathered|gathered_requests|writes_relayed|relay_requests)_total/{printf "%s %s  ", $1, $2}')"
  for i in 0 1 2; do
    echo "   node$i: $(curl -s http://127.0.0.1:$((19410 + i))/metrics |
      awk '/^packrat_node_(steps_relayed|relay_requests)_total/{printf "%s %s  ", $1, $2}')"
  done
  stop_all
}
echo "$WORKLOAD through a cluster, $CONC connections, $DURATION per round"
for r in $(seq 1 "$ROUNDS"); do
  if ((r % 2)); then
    one "A" "$PACKRAT_A"
    one "B" "$PACKRAT_B"
  else
    one "B" "$PACKRAT_B"
    one "A" "$PACKRAT_A"
  fi
done
