#!/usr/bin/env bash
# Loads N objects into a fresh packrat, then reports: the time to list the whole prefix
# (1000-key pages), RocksDB bytes on disk per object (settled by a flush and compaction), and
# server RSS after loading.
#
#   N=1000000 bench/index_cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000000}
SIZE=${SIZE:-1KiB}
AK=indexcostaccesskey
SK=index-cost-secret-0123456789
work=$(mktemp -d /tmp/packrat-index-cost.XXXXXX)
cargo build -q -p packrat
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK
"$BIN" serve --data-dir "$work/data" --listen 127.0.0.1:19100 --log warn >"$work/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 60); do curl -sf http://127.0.0.1:19100/health/ready >/dev/null 2>&1 && break; sleep 0.5; done
ep=http://127.0.0.1:19100
echo "== loading $N objects of $SIZE"
"$BIN" bench --endpoint "$ep" --bucket index-cost --workload get --prepare --ops 0 --keys "$N" --size "$SIZE" --prefix "train/" --concurrency 64 --server-pid $pid | tail -1
echo "== listing the whole prefix"
"$BIN" bench --endpoint "$ep" --bucket index-cost --workload list --prefix "train/" --duration 10m --server-pid $pid
echo "== index cost"
status=$("$BIN" admin --endpoint "$ep" status --flush)
rss_kib=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
python3 - "$status" "$N" "$rss_kib" <<'PY'
import json, sys
st, n, rss = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sst = st["index"]["sst_bytes"]
key_bytes = 8 + len("train/") + 8   # bucket id + key
print(f"objects          {n}")
print(f"index SST bytes  {sst} ({sst / n:.1f} per object including keys, {sst / n - key_bytes:.1f} excluding the {key_bytes}-byte key)")
print(f"segment bytes    {st['segment_disk_bytes']}")
print(f"server RSS       {rss / 1024:.0f} MiB after loading")
print(f"group commit     {st['appends']} appends in {st['syncs']} fdatasyncs ({st['appends'] / max(st['syncs'], 1):.1f} per sync)")
PY
