#!/usr/bin/env bash
# packrat's CPU per 4 KiB GET (and HEAD) against nginx serving the same objects as files: the
# floor a static file server sets for a small read (issue 66). Both on loopback, one process
# each (nginx with one worker, sendfile on, no access log; packrat as `packrat serve` runs),
# driven by the same `packrat bench` load, rounds alternating packrat, nginx, packrat, ...;
# each server's CPU (user and system, from /proc) per operation, and the medians' ratio.
# nginx ignores the signature packrat checks: packrat's count includes SigV4, nginx's nothing
# like it.
#
#   bench/nginx.sh                                  # defaults below
#   ROUNDS=5 DURATION=10s CONCURRENCY=64 WORKLOADS="get head" bench/nginx.sh
#
# Needs Debian's nginx package. For figures against peers use a release build
# (PACKRAT_BIN=target/release/packrat): the dev profile's debug assertions cost a quarter.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
KEYS=${KEYS:-10000}
SIZE=${SIZE:-4KiB}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8s}
CONCURRENCY=${CONCURRENCY:-64}
WORKLOADS=${WORKLOADS:-"get"}
AK=nginxcompareaccesskey
SK=nginx-compare-secret-0123456789
command -v nginx >/dev/null || { echo "needs nginx (apt-get install nginx)" >&2; exit 2; }
work=$(mktemp -d /tmp/packrat-nginx.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$BIN" serve \
  --data-dir "$work/packrat" --listen 127.0.0.1:19300 --log warn >"$work/packrat.log" 2>&1 &
packrat_pid=$!
pids+=("$packrat_pid")

bench/nginx_site.py "$work/nginx" 19301 bench "$KEYS" "$SIZE"
# (nginx reads an NGINX variable as sockets handed over by an upgrade.)
env -u NGINX nginx -c "$work/nginx/nginx.conf" -p "$work/nginx" >"$work/nginx.log" 2>&1 &
nginx_pid=$!
pids+=("$nginx_pid")

ready() { # url
  for _ in $(seq 1 100); do
    python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "no answer from $1" >&2
  exit 1
}
ready "http://127.0.0.1:19300/health/ready"

bench() { # port pid label args...
  local port=$1 pid=$2 label=$3
  shift 3
  AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "http://127.0.0.1:$port" \
    --bucket bench --prefix k/ --size "$SIZE" --keys "$KEYS" --concurrency "$CONCURRENCY" \
    --server-pid "$pid" --label "$label" --json "$@"
}
bench 19300 "$packrat_pid" upload --workload put --prepare --ops 0 >/dev/null
ready "http://127.0.0.1:19301/bench/k/00000000"

results=$work/results.jsonl
for w in $WORKLOADS; do
  # One pass each first: page cache and connections warm.
  bench 19300 "$packrat_pid" warm --workload "$w" --duration 2s >/dev/null
  bench 19301 "$nginx_pid" warm --workload "$w" --duration 2s >/dev/null
  for r in $(seq 1 "$ROUNDS"); do
    bench 19300 "$packrat_pid" "packrat $w $r" --workload "$w" --duration "$DURATION" >>"$results"
    bench 19301 "$nginx_pid" "nginx $w $r" --workload "$w" --duration "$DURATION" >>"$results"
  done
done

python3 - "$results" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in runs:
    server, work, _ = r["label"].split()
    by.setdefault((work, server), []).append(r)
print("| workload | server | ops/s (median) | CPU µs per op (median, each round) |")
print("|---|---|---|---|")
for (work, server), rs in sorted(by.items()):
    ops = statistics.median(r["ops_per_sec"] for r in rs)
    cpu = [r["server_cpu_us_per_op"] for r in rs]
    print(f"| {work} | {server} | {ops:,.0f} | {statistics.median(cpu):.1f} ({', '.join(f'{c:.1f}' for c in cpu)}) |")
for work in sorted({w for w, _ in by}):
    p = statistics.median(r["server_cpu_us_per_op"] for r in by[(work, "packrat")])
    n = statistics.median(r["server_cpu_us_per_op"] for r in by[(work, "nginx")])
    print(f"{work}: packrat {p / n:.2f}x nginx's CPU per operation")
PY
