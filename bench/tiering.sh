#!/usr/bin/env bash
# Storage tiers in one run on this machine: one packrat with an HDD-directory tier
# (STANDARD_IA) and a cloud tier (GLACIER_IR) whose remote is a second packrat on loopback.
# Three buckets of KEYS objects of SIZE each are uploaded; a lifecycle rule moves one bucket to
# each tier (`admin tier run`, timed: MB/s and objects/s of the move, which includes reading
# the records, building and syncing segments, the copy or multipart upload, reading the copy
# back to verify it, switching the objects over and compacting NVMe); then random GETs of each
# bucket report latency per tier. The tier read cache is kept small (TIER_CACHE) so most tiered
# GETs miss it. Both tiers live on this machine's one disk: the figures are packrat's own cost,
# not an HDD's or a WAN's latency.
#
#   bench/tiering.sh
#   KEYS=5000 SIZE=16KiB bench/tiering.sh
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-10000}
SIZE=${SIZE:-64KiB}
DURATION=${DURATION:-15s}
CONCURRENCY=${CONCURRENCY:-8}
TIER_CACHE=${TIER_CACHE:-$((64 << 20))}
AK=tierbenchaccesskey
SK=tierbench-secret-key-0123456789
work=$(mktemp -d /tmp/packrat-tier.XXXXXX)
results=$work/results.jsonl
cargo build -q -p packrat
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
PORT=${PORT:-19400}
RPORT=$((PORT + 1))
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
wait_ready() {
  for _ in $(seq 1 100); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health/ready', timeout=1)" 2>/dev/null && return
    sleep 0.2
  done
  echo "server on $1 did not start" >&2; exit 1
}

PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$BIN" serve --data-dir "$work/remote" \
  --listen 127.0.0.1:$RPORT --log warn >"$work/remote.log" 2>&1 &
pids+=($!)
wait_ready $RPORT
AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK \
  "$BIN" serve --data-dir "$work/data" --listen 127.0.0.1:$PORT --log warn \
  --tier "STANDARD_IA=dir:$work/hdd" --tier "GLACIER_IR=s3://remote/segments?endpoint=http://127.0.0.1:$RPORT" \
  --tier-interval 0 --tier-rate 0 --tier-cache-bytes "$TIER_CACHE" --compact-interval 0 >"$work/packrat.log" 2>&1 &
pid=$!
pids+=($pid)
wait_ready $PORT

export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK
python3 - "$RPORT" <<'PY'
import boto3, os, sys
from botocore.config import Config
boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1",
             config=Config(s3={"addressing_style": "path"})).create_bucket(Bucket="remote")
PY
for b in nvme hdd cloud; do
  echo "== uploading $KEYS x $SIZE to bucket $b" >&2
  "$BIN" bench --endpoint "http://127.0.0.1:$PORT" --bucket "$b" --workload get --prepare --ops 0 \
    --size "$SIZE" --keys "$KEYS" --prefix k/ --concurrency 32 >/dev/null
done

move() { # bucket class
  python3 - "$PORT" "$1" "$2" <<'PY'
import boto3, sys
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}))
s3.put_bucket_lifecycle_configuration(Bucket=sys.argv[2], LifecycleConfiguration={"Rules": [
    {"ID": "to-tier", "Filter": {"Prefix": ""}, "Status": "Enabled",
     "Transitions": [{"Days": 1, "StorageClass": sys.argv[3]}]}]})
PY
  echo "== moving bucket $1 to $2" >&2
  "$BIN" admin --endpoint "http://127.0.0.1:$PORT" tier run --days-ahead 2 >&2
  "$BIN" admin --endpoint "http://127.0.0.1:$PORT" tier status | python3 -c "
import json, sys
s = json.load(sys.stdin)
r = s['run']['report']
print(json.dumps({'label': 'move to $2', 'objects': r['objects_moved'], 'bytes': r['bytes_moved'], 'seconds': r['seconds'],
                  'segments': r['segments_written'], 'nvme_reclaimed': r['nvme_bytes_reclaimed']}))" >>"$results"
}
move hdd STANDARD_IA
move cloud GLACIER_IR
"$BIN" admin --endpoint "http://127.0.0.1:$PORT" tier status >"$work/status.json"

for b in nvme hdd cloud; do
  "$BIN" bench --endpoint "http://127.0.0.1:$PORT" --bucket "$b" --workload get --size "$SIZE" --keys "$KEYS" \
    --prefix k/ --concurrency "$CONCURRENCY" --duration "$DURATION" --server-pid "$pid" --label "GET $b" --json >>"$results"
done

python3 - "$results" "$work/status.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
st = json.load(open(sys.argv[2]))
print("| tier move | objects | MB | seconds | objects/s | MB/s | segments | NVMe bytes reclaimed |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["label"].startswith("move"):
        print(f"| {r['label']} | {r['objects']} | {r['bytes'] / 1e6:.0f} | {r['seconds']:.1f} | "
              f"{r['objects'] / r['seconds']:.0f} | {r['bytes'] / 1e6 / r['seconds']:.0f} | {r['segments']} | {r['nvme_reclaimed']} |")
print()
print("| GET (random keys) | tier | ops/s | MB/s | p50 ms | p99 ms | max ms | errors |")
print("|---|---|---|---|---|---|---|---|")
tier = {"GET nvme": "STANDARD (NVMe)", "GET hdd": "STANDARD_IA (directory)", "GET cloud": "GLACIER_IR (packrat on loopback)"}
for r in rows:
    if r["label"].startswith("GET"):
        print(f"| {r['label']} | {tier[r['label']]} | {r['ops_per_sec']:.0f} | {r['mb_per_sec']:.0f} | "
              f"{r['latency_us_p50'] / 1000:.2f} | {r['latency_us_p99'] / 1000:.2f} | {r['latency_us_max'] / 1000:.1f} | {r['errors']} |")
print()
print("tiers after the moves:", json.dumps(st["tiers"]))
PY
