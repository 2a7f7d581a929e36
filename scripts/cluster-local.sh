#!/usr/bin/env bash
# A packrat cluster on one machine, on loopback: a private etcd, three storage nodes and two
# gateways (S3 on 127.0.0.1:9000 and :9001), data under ${PACKRAT_CLUSTER_DIR:-./packrat-cluster}.
# Ctrl-C stops everything it started. Needs Debian's etcd-server (`apt-get install etcd-server`).
#
#   scripts/cluster-local.sh                 # start (builds packrat first)
#   packrat cluster --etcd http://127.0.0.1:2379 status
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${PACKRAT_CLUSTER_DIR:-./packrat-cluster}
etcd_url=http://127.0.0.1:2379
command -v etcd >/dev/null || { echo "no etcd: apt-get install etcd-server" >&2; exit 2; }
cargo build -q
bin=target/debug/packrat
mkdir -p "$dir"

pids=()
cleanup() {
  # Gateways, then nodes, then etcd: each by the id this script started it with.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM

etcd --name local --data-dir "$dir/etcd" \
  --listen-client-urls $etcd_url --advertise-client-urls $etcd_url \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster local=http://127.0.0.1:2380 --log-level warn >"$dir/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  curl -fs $etcd_url/health >/dev/null 2>&1 && break
  sleep 0.2
done

# The first start makes the cluster (its root key from PACKRAT_ROOT_* or generated, printed).
if ! $bin cluster --etcd $etcd_url status >/dev/null 2>&1; then
  $bin cluster --etcd $etcd_url init --pgs 256 --replicas 3
fi

# Three nodes share this machine: each takes a third of its cores for its runtime (at least
# one thread), rather than one thread per core each.
node_threads=$(( $(nproc) / 3 > 0 ? $(nproc) / 3 : 1 ))
for i in 0 1 2; do
  $bin node --etcd $etcd_url --data-dir "$dir/node$i" --listen 127.0.0.1:$((9100 + i)) \
    --worker-threads "$node_threads" >"$dir/node$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  $bin gateway --etcd $etcd_url --listen 127.0.0.1:$((9000 + i)) >"$dir/gateway$i.log" 2>&1 &
  pids+=($!)
done
sleep 2
$bin cluster --etcd $etcd_url status
echo "S3 on http://127.0.0.1:9000 and http://127.0.0.1:9001; logs in $dir; Ctrl-C stops"
wait
