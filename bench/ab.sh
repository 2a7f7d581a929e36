#!/usr/bin/env bash
# Two packrat binaries, A (before a change) and B (after), on the same workloads, alternating
# A, B, A, B, ... so both see the same machine state; then a table of every round and the
# median B/A ratio per workload. Each round starts a server on a fresh data directory, uploads
# KEYS objects of SIZE, and measures SIZE PUT (overwrites of the same keys), GET and batch GET
# (BATCH_SIZE random keys per request). The load generator is B's `packrat bench` in every
# round, so only the server changes.
#
#   PACKRAT_A=/tmp/packrat-before PACKRAT_B=target/debug/packrat bench/ab.sh
#   ROUNDS=5 DURATION=15s KEYS=20000 WORKLOADS="get" bench/ab.sh
#   KEYS=200000 WORKLOADS=stream bench/ab.sh     # epoch streams: one epoch over 4 shards
#   BENCH_USER=1 WORKLOADS="put get" bench/ab.sh  # as a user key, not root (authorization runs)
#   BENCH_USER=1 BUCKET_POLICY=bench/policy-example.json bench/ab.sh   # ... under a policy
#
# The root key skips authorization (it may do anything), so a change to who-may-do-what is
# measured with BENCH_USER=1: a user key made through the admin API owns the bucket and sends
# every request. BUCKET_POLICY (needs BENCH_USER) puts that policy on the bucket after the
# upload; `BUCKET` in the file stands for the bucket's name. POLICY_SIDES=B puts it on B's
# bucket only (the cost of a policy against a binary from before policies).
#
#   PACKRAT_A=target/debug/packrat SSE_SIDES=B WORKLOADS="put get" bench/ab.sh
#
# SSE_SIDES names the sides whose objects are written with SSE-S3 (`packrat bench --sse`, on
# the upload and every PUT): with the same binary on both sides, what encryption costs.
#
#   PACKRAT_A=target/debug/packrat VERSIONING_SIDES=B WORKLOADS="put get" bench/ab.sh
#
# VERSIONING_SIDES names the sides whose bucket has versioning (`packrat bench --versioning`):
# every PUT then keeps the version it overwrites.
set -euo pipefail
cd "$(dirname "$0")/.."

A=${PACKRAT_A:?set PACKRAT_A to the binary from before the change}
B=${PACKRAT_B:-${CARGO_TARGET_DIR:-target}/debug/packrat}
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-20000}
SIZE=${SIZE:-4KiB}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-64}
BATCH_SIZE=${BATCH_SIZE:-1000}
BATCH_CONNECTIONS=${BATCH_CONNECTIONS:-4}
LOG=${LOG:-warn}                 # the servers' --log (info: with the access log)
WORKLOADS=${WORKLOADS:-"put get batch"}
PORT=${PORT:-19200}
AK=abbenchaccesskey
SK=abbench-secret-key-0123456789
# The key the load generator signs with: root's, or a user's (BENCH_USER=1).
BAK=$AK
BSK=$SK
if [ "${BENCH_USER:-0}" = 1 ]; then
  BAK=abbenchuserkey
  BSK=abbench-user-secret-0123456789
fi
work=$(mktemp -d /tmp/packrat-ab.XXXXXX)
results=$work/results.jsonl
pid=
side_args=()

cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

bench() { # label args...
  local label=$1; shift
  AWS_ACCESS_KEY_ID=$BAK AWS_SECRET_ACCESS_KEY=$BSK "$B" bench --endpoint "http://127.0.0.1:$PORT" \
    --server-pid "$pid" --label "$label" --json --bucket abbench --size "$SIZE" --keys "$KEYS" \
    --prefix k/ "${side_args[@]}" "$@" | tee -a "$results"
}

for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$A; [ "$side" = B ] && bin=$B
    side_args=()
    [[ " ${SSE_SIDES:-} " == *" $side "* ]] && side_args=(--sse)
    [[ " ${VERSIONING_SIDES:-} " == *" $side "* ]] && side_args+=(--versioning)
    rm -rf "$work/data"
    PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$bin" serve \
      --data-dir "$work/data" --listen 127.0.0.1:$PORT --log "$LOG" >"$work/server-$side.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
      python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health/ready', timeout=1)" 2>/dev/null && break
      sleep 0.2
    done
    echo "== round $round, $side ($bin)" >&2
    if [ "$BAK" != "$AK" ]; then
      PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$B" admin --endpoint "http://127.0.0.1:$PORT" \
        key create --name abbench --access-key "$BAK" --secret-key "$BSK" >/dev/null
    fi
    bench "prepare" --workload get --prepare --ops 0 --concurrency 64 >/dev/null
    if [ -n "${BUCKET_POLICY:-}" ] && [[ " ${POLICY_SIDES:-A B} " == *" $side "* ]]; then
      sed "s/BUCKET/abbench/g" "$BUCKET_POLICY" >"$work/policy.json"
      AWS_ACCESS_KEY_ID=$BAK AWS_SECRET_ACCESS_KEY=$BSK AWS_DEFAULT_REGION=us-east-1 \
        "${AWS_CLI:-.venv/bin/aws}" --endpoint-url "http://127.0.0.1:$PORT" \
        s3api put-bucket-policy --bucket abbench --policy "file://$work/policy.json"
    fi
    for w in $WORKLOADS; do
      case $w in
        put) bench "$side $round PUT" --workload put --concurrency "$CONCURRENCY" --duration "$DURATION" >/dev/null ;;
        get) bench "$side $round GET" --workload get --concurrency "$CONCURRENCY" --duration "$DURATION" >/dev/null ;;
        batch) bench "$side $round batch GET" --workload batch --batch-order request --batch-size "$BATCH_SIZE" \
          --concurrency "$BATCH_CONNECTIONS" --duration "$DURATION" >/dev/null ;;
        # STREAM_EPOCHS epochs one after the other (the first after start-up reads a cold
        # record cache), each split over STREAM_SHARDS connections streaming their shard once.
        stream) for e in $(seq 1 "${STREAM_EPOCHS:-3}"); do
            bench "$side $round stream epoch $e" --workload stream --concurrency "${STREAM_SHARDS:-4}" >/dev/null
          done ;;
        *) echo "unknown workload $w (put, get, batch, stream)" >&2; exit 2 ;;
      esac
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
  done
done

python3 - "$results" "$SIZE" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if not r["label"].startswith("prepare")]
size = sys.argv[2]
print(f"| round | side | workload ({size}) | ops/s | samples/s | p50 ms | p99 ms | server CPU µs/sample | errors |")
print("|---|---|---|---|---|---|---|---|---|")
per = {}
for r in rows:
    side, rnd, work = r["label"].split(" ", 2)
    n = r.get("samples") or r["ops"]
    samples = r.get("samples_per_sec") or r["ops_per_sec"]
    cpu = r["server_cpu_us_per_op"] * r["ops"] / n if r.get("server_cpu_us_per_op") and n else float("nan")
    per.setdefault(work, {}).setdefault(side, []).append((samples, cpu))
    print(f"| {rnd} | {side} | {work} | {r['ops_per_sec']:.0f} | {samples:.0f} | {r['latency_us_p50']/1000:.2f} | "
          f"{r['latency_us_p99']/1000:.2f} | {cpu:.1f} | {r['errors']} |")
print()
for work, sides in per.items():
    a, b = sides.get("A", []), sides.get("B", [])
    if not a or not b:
        continue
    ma, mb = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
    ca, cb = statistics.median(x[1] for x in a), statistics.median(x[1] for x in b)
    spread = lambda xs: (max(x[0] for x in xs) - min(x[0] for x in xs)) / statistics.median(x[0] for x in xs)
    print(f"{work}: median samples/s A {ma:.0f}, B {mb:.0f} (B/A {mb/ma:.3f}); "
          f"run-to-run spread A {spread(a):.1%}, B {spread(b):.1%}; "
          f"server CPU µs/sample A {ca:.1f}, B {cb:.1f}")
PY
