#!/usr/bin/env bash
# Erasure coding against a single disk, in one run on this machine: the same PUT and GET loads
# against a server with one segment directory and against one with six disk directories and
# --ec 4+2 (all on the same file system here, so the figures measure packrat's work — mirroring,
# encoding, shard reads — not independent disks). Then, for --ec only: the space overhead after
# every segment is sealed and encoded, and the same GETs with two of the six disk directories
# deleted (every read of a record on a lost data shard is rebuilt from four others).
#
#   bench/erasure.sh
#   KEYS=5000 DURATION=10s bench/erasure.sh
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-20000}          # 64 KiB objects; a tenth as many 1 MiB objects
DURATION=${DURATION:-15s}
AK=ecbenchaccesskey
SK=ecbench-secret-key-0123456789
work=$(mktemp -d /tmp/packrat-ec.XXXXXX)
results=$work/results.jsonl
cargo build -q -p packrat
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
PORT=${PORT:-19300}
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

start() { # name args...
  local name=$1; shift
  PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$BIN" serve --data-dir "$work/$name" \
    --listen 127.0.0.1:$PORT --log warn --segment-size $((256 << 20)) --seal-idle 2 \
    --compact-interval 0 --scrub-interval 0 "$@" >>"$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health/ready', timeout=1)" 2>/dev/null && return
    sleep 0.2
  done
  echo "server did not start" >&2; exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }
status() {
  PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$BIN" admin --endpoint "http://127.0.0.1:$PORT" status
}
bench() { # label args...
  local label=$1; shift
  AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "http://127.0.0.1:$PORT" \
    --server-pid "$pid" --label "$label" --json "$@" | tee -a "$results"
}
loads() { # config
  local c=$1 big=$((KEYS / 10))
  bench "$c PUT 64KiB" --bucket ecb --workload put --size 64KiB --keys "$KEYS" --ops "$KEYS" --prefix s/ --concurrency 16 --duration 30m
  bench "$c PUT 1MiB" --bucket ecb --workload put --size 1MiB --keys "$big" --ops "$big" --prefix l/ --concurrency 8 --duration 30m
}
gets() { # label
  local c=$1 big=$((KEYS / 10))
  bench "$c GET 64KiB" --bucket ecb --workload get --size 64KiB --keys "$KEYS" --prefix s/ --concurrency 64 --duration "$DURATION"
  bench "$c GET 1MiB" --bucket ecb --workload get --size 1MiB --keys "$big" --prefix l/ --concurrency 16 --duration "$DURATION"
}

echo "== single disk" >&2
start single --disk "$work/single-disk"
loads "single disk"
gets "single disk"
stop

echo "== six disks, --ec 4+2" >&2
disks=()
for i in 0 1 2 3 4 5; do disks+=(--disk "$work/ec-disk$i"); done
start ec --ec 4+2 "${disks[@]}"
loads "ec 4+2"
echo "waiting for every segment to be sealed and encoded..." >&2
for _ in $(seq 1 300); do
  status >"$work/status.json"
  python3 -c "
import json, sys
s = json.load(open('$work/status.json'))
sys.exit(0 if s['erasure']['segments_sealed'] == 0 and s['active_segment_bytes'] <= 32 else 1)" && break
  sleep 1
done
python3 - "$work/status.json" "$KEYS" >>"$results" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
keys = int(sys.argv[2])
logical = keys * 65536 + (keys // 10) * 1048576
print(json.dumps({"label": "space", "disk_bytes": s["segment_disk_bytes"], "logical_bytes": logical,
                  "overhead": s["segment_disk_bytes"] / logical,
                  "encoded_segments": s["erasure"]["segments_encoded"]}))
PY
gets "ec 4+2"
stop
rm -rf "$work/ec-disk1" "$work/ec-disk4"
start ec --ec 4+2 "${disks[@]}"
gets "ec 4+2, 2 disks lost"
status >"$work/status-degraded.json"
stop

python3 - "$results" "$work/status-degraded.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
space = [r for r in rows if r["label"] == "space"]
rows = [r for r in rows if r["label"] != "space"]
by = {r["label"]: r for r in rows}
print("| run | ops/s | MB/s | p50 ms | p99 ms | server CPU µs/op | vs single disk (MB/s) | errors |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    name = r["label"]
    op = " ".join(name.split()[-2:])
    base = by.get(f"single disk {op}")
    ratio = f"{r['mb_per_sec'] / base['mb_per_sec']:.2f}x" if base and base is not r and base["mb_per_sec"] else ""
    cpu = r.get("server_cpu_us_per_op")
    print(f"| {name} | {r['ops_per_sec']:.0f} | {r['mb_per_sec']:.0f} | {r['latency_us_p50'] / 1000:.2f} | "
          f"{r['latency_us_p99'] / 1000:.2f} | {cpu:.0f} | {ratio} | {r['errors']} |" if cpu is not None else
          f"| {name} | {r['ops_per_sec']:.0f} | {r['mb_per_sec']:.0f} | {r['latency_us_p50'] / 1000:.2f} | "
          f"{r['latency_us_p99'] / 1000:.2f} | | {ratio} | {r['errors']} |")
for s in space:
    print(f"\nspace after sealing (--ec 4+2): {s['disk_bytes']} bytes on disk for {s['logical_bytes']} "
          f"logical bytes = {s['overhead']:.3f}x (ideal (k+m)/k = 1.500x; "
          f"{(s['overhead'] / 1.5 - 1) * 100:+.1f}%), {s['encoded_segments']} segments encoded")
d = json.load(open(sys.argv[2]))
print(f"degraded reads while 2 disks were lost: {d['degraded_reads']}")
PY
