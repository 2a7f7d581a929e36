#!/usr/bin/env bash
# Batch GET against per-object GETs with a cold page cache (samples read from the disk, not
# memory): 100,000 objects of 4 KiB are uploaded, then, each after dropping the page cache
# (needs root: /proc/sys/vm/drop_caches), 30,000 per-object GETs of random keys at 64
# connections and 30 batch GETs of 1000 random keys on 4 connections. Short runs on purpose:
# a long one would warm the cache it measures. Twice each.
#
#   sudo bench/cold.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -w /proc/sys/vm/drop_caches ] || { echo "needs root (writes /proc/sys/vm/drop_caches)" >&2; exit 1; }
KEYS=${KEYS:-100000}
AK=coldbenchaccesskey
SK=coldbench-secret-key-0123456789
work=$(mktemp -d /tmp/packrat-cold.XXXXXX)
cargo build -q -p packrat
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
PORT=${PORT:-19101}
PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$BIN" serve \
  --data-dir "$work/data" --listen 127.0.0.1:$PORT --log warn >"$work/packrat.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health/ready', timeout=1)" 2>/dev/null && break
  sleep 0.2
done
bench() {
  AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "http://127.0.0.1:$PORT" \
    --server-pid "$pid" --bucket cold --size 4KiB --keys "$KEYS" --prefix k/ "$@"
}
bench --workload get --prepare --ops 0 --concurrency 64 >/dev/null
for round in 1 2; do
  sync; echo 1 >/proc/sys/vm/drop_caches
  echo "round $round, per-object GET (64 connections), cold:"
  bench --workload get --ops 30000 --concurrency 64 | grep -E "throughput|latency"
  sync; echo 1 >/proc/sys/vm/drop_caches
  echo "round $round, batch GET (1000 keys, 4 connections), cold:"
  bench --workload batch --batch-size 1000 --ops 30 --concurrency 4 | grep -E "samples|latency"
done
