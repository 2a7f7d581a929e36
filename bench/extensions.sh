#!/usr/bin/env bash
# packrat's data-loader extensions against per-object GETs and against streaming one large
# object, all in one run on one server: for each sample size, 100,000 objects are uploaded
# (64 connections, so their records interleave on disk as real uploads do), then
#   - per-object GETs at 64 connections (random keys),
#   - batch GET of random keys, request order and storage order,
#   - one epoch stream of the whole prefix, split into shards over a few connections,
#   - GETs of one large object of the same total size (capped at 4 GiB, a single PUT),
# and a table of samples/s, payload MB/s and the ratios the issue sets targets for.
#
#   bench/extensions.sh                       # 4 KiB and 100 KiB, 100,000 objects each
#   KEYS=20000 SIZES="4KiB" bench/extensions.sh
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-100000}
SIZES=${SIZES:-"4KiB 100KiB"}
DURATION=${DURATION:-15s}
BATCH_SIZE=${BATCH_SIZE:-1000}
BATCH_CONNECTIONS=${BATCH_CONNECTIONS:-4}
STREAM_CONNECTIONS=${STREAM_CONNECTIONS:-4}
AK=extbenchaccesskey
SK=extbench-secret-key-0123456789
work=$(mktemp -d /tmp/packrat-ext.XXXXXX)
results=$work/results.jsonl

cargo build -q -p packrat
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
PORT=${PORT:-19100}
PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$BIN" serve \
  --data-dir "$work/data" --listen 127.0.0.1:$PORT --log warn >"$work/packrat.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health/ready', timeout=1)" 2>/dev/null && break
  sleep 0.2
done

bench() { # label args...
  local label=$1; shift
  AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "http://127.0.0.1:$PORT" \
    --server-pid "$pid" --label "$label" --json "$@" | tee -a "$results"
}

for size in $SIZES; do
  bytes=$(python3 -c "
s='$size'
for suf, m in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
    if s.endswith(suf): print(int(s[:-len(suf)]) * m); break
else: print(int(s))")
  total=$((bytes * KEYS))
  large=$(( total < 4294967296 ? total : 4294967296 ))
  b=s$(echo "$size" | tr 'A-Z' 'a-z')
  echo "== $size: uploading $KEYS objects, and one object of $large bytes" >&2
  bench "prepare $size" --bucket "$b" --workload get --prepare --ops 0 --size "$size" --keys "$KEYS" --prefix k/ --concurrency 64
  bench "prepare large" --bucket "$b" --workload put --size "$large" --keys 1 --prefix large/ --ops 1 --duration 30m --concurrency 1
  bench "$size per-object GET" --bucket "$b" --workload get --size "$size" --keys "$KEYS" --prefix k/ --duration "$DURATION" --concurrency 64
  bench "$size batch GET (request order)" --bucket "$b" --workload batch --batch-order request --batch-size "$BATCH_SIZE" \
    --size "$size" --keys "$KEYS" --prefix k/ --duration "$DURATION" --concurrency "$BATCH_CONNECTIONS"
  bench "$size batch GET (storage order)" --bucket "$b" --workload batch --batch-order storage --batch-size "$BATCH_SIZE" \
    --size "$size" --keys "$KEYS" --prefix k/ --duration "$DURATION" --concurrency "$BATCH_CONNECTIONS"
  bench "$size epoch stream" --bucket "$b" --workload stream --size "$size" --keys "$KEYS" --prefix k/ \
    --concurrency "$STREAM_CONNECTIONS" --duration 30m
  bench "$size large object GET" --bucket "$b" --workload get --size "$large" --keys 1 --prefix large/ \
    --concurrency 1 --duration "$DURATION"
done

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if not r["label"].startswith("prepare")]
print("| run | samples/s | payload MB/s | p50 ms | p99 ms | server CPU µs/sample | server RSS peak MiB | errors |")
print("|---|---|---|---|---|---|---|---|")
by = {}
for r in rows:
    samples = r.get("samples_per_sec") or (r["ops_per_sec"] if "large" not in r["label"] else None)
    n = r.get("samples") or r["ops"]
    cpu = r["server_cpu_us_per_op"] * r["ops"] / n if r.get("server_cpu_us_per_op") and n else None
    by[r["label"]] = (samples, r["mb_per_sec"])
    fmt = lambda v, f: "-" if v is None else f.format(v)
    print(f"| {r['label']} | {fmt(samples, '{:.0f}')} | {r['mb_per_sec']:.1f} | {r['latency_us_p50']/1000:.1f} | "
          f"{r['latency_us_p99']/1000:.1f} | {fmt(cpu, '{:.1f}')} | {fmt(r.get('server_rss_peak_mib'), '{:.0f}')} | {r['errors']} |")
print()
sizes = sorted({l.split()[0] for l in by}, key=lambda s: len(s))
for s in sizes:
    g, br, bs, st, lg = (by.get(f"{s} {k}") for k in ("per-object GET", "batch GET (request order)",
                         "batch GET (storage order)", "epoch stream", "large object GET"))
    if not all((g, br, bs, st, lg)):
        continue
    print(f"{s}: batch/per-object samples/s  request {br[0]/g[0]:.1f}x  storage {bs[0]/g[0]:.1f}x   "
          f"(target 10x for 4 KiB)")
    print(f"{s}: MB/s vs one large object  batch request {br[1]/lg[1]:.0%}  storage {bs[1]/lg[1]:.0%}  "
          f"epoch stream {st[1]/lg[1]:.0%}   (targets: batch 50% at 4 KiB, stream 80% at 100 KiB)")
PY
