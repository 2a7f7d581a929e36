#!/usr/bin/env bash
# What a cluster costs, on one machine: the CPU time of all packrat processes per operation for
# the same loads against `packrat serve` (embedded) and against one gateway in front of three
# nodes with R=3, all on loopback. On 2 cores, throughput cannot grow with nodes, so the figure
# is cost: CPU per operation (gateway + nodes, and each of the two apart; etcd shown apart), and
# the latency at 64 connections; a batch GET of 1,000 random keys per request (4 connections)
# counted per sample; multipart uploads of 32 MiB in 8 MiB parts (2 connections), per MiB.
# Each node runs NODE_THREADS runtime threads (a third of the machine's cores by default, at
# least one, as scripts/cluster-local.sh gives them: three nodes share the machine); the
# gateway and the embedded server take the default, one per core.
# Prints a table (and the JSON lines in $work/results.jsonl with KEEP=1).
#
#   bench/cluster.sh
#   KEYS=5000 DURATION=10s bench/cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-20000}
DURATION=${DURATION:-15s}
CONC=${CONC:-64}
NODE_THREADS=${NODE_THREADS:-$(( $(nproc) / 3 > 0 ? $(nproc) / 3 : 1 ))}
AK=clusterbenchkey
SK=clusterbench-secret-0123456789
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 2; }
cargo build -q -p packrat
BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
work=$(mktemp -d /tmp/packrat-cluster-bench.XXXXXX)
results=$work/results.jsonl
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
export PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK

ready() { # url
  for _ in $(seq 1 150); do
    curl -fs "$1" >/dev/null 2>&1 && return
    sleep 0.2
  done
  echo "not ready: $1" >&2; exit 1
}
# CPU seconds (user + system) of the given processes, from /proc.
cpu() {
  local t=0 p
  for p in "$@"; do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t $(getconf CLK_TCK)" | awk '{printf "%.3f", $1 / $2}'
}
# One load; appends its JSON with the CPU per op of the processes given, and of the first of
# them alone (the process clients talk to: the embedded server, or the gateway).
run() { # label endpoint "pids" bench-args...
  local label=$1 endpoint=$2 procs=$3; shift 3
  local before after front_before front_after
  front_before=$(cpu ${procs%% *})
  before=$(cpu $procs)
  out=$(AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "$endpoint" \
    --label "$label" --json --concurrency "${RUN_CONC:-$CONC}" --keys "$KEYS" --duration "$DURATION" "$@")
  front_after=$(cpu ${procs%% *})
  after=$(cpu $procs)
  python3 -c "
import json, sys
r = json.loads(sys.argv[1])
# A batch GET's unit is the sample (a TAR entry), as a GET's is the object.
n = max(r.get('samples') or r['ops'], 1)
r['cpu_us_per_op'] = (float(sys.argv[3]) - float(sys.argv[2])) * 1e6 / n
r['front_cpu_us_per_op'] = (float(sys.argv[5]) - float(sys.argv[4])) * 1e6 / n
print(json.dumps(r))" "$out" "$before" "$after" "$front_before" "$front_after" \
    | tee -a "$results" >/dev/null
}
# Prepares (uploads) the keys once, then PUT and GET loads.
loads() { # label endpoint "pids"
  AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$BIN" bench --endpoint "$2" --workload get \
    --keys "$KEYS" --prepare --ops 1 --concurrency 8 >/dev/null
  run "$1" "$2" "$3" --workload get
  run "$1" "$2" "$3" --workload put
  RUN_CONC=4 run "$1" "$2" "$3" --workload batch --batch-order request --batch-size 1000
  # Multipart uploads of 32 MiB objects in 8 MiB parts, 2 at a time (the keys rewritten in turn).
  RUN_CONC=2 run "$1" "$2" "$3" --workload multipart --size "${MP_SIZE:-32MiB}" --part-size 8MiB \
    --prefix mp/
}

# Embedded.
"$BIN" serve --data-dir "$work/embedded" --listen 127.0.0.1:19400 --log warn \
  --compact-interval 0 >"$work/embedded.log" 2>&1 &
serve_pid=$!
pids+=($serve_pid)
ready http://127.0.0.1:19400/health/ready
loads embedded http://127.0.0.1:19400 "$serve_pid"
kill "$serve_pid"; wait "$serve_pid" 2>/dev/null || true

# A cluster: etcd, three nodes (R=3), one gateway.
etcd_url=http://127.0.0.1:19479
etcd --name b --data-dir "$work/etcd" --listen-client-urls $etcd_url --advertise-client-urls $etcd_url \
  --listen-peer-urls http://127.0.0.1:19480 --initial-advertise-peer-urls http://127.0.0.1:19480 \
  --initial-cluster b=http://127.0.0.1:19480 --log-level error >"$work/etcd.log" 2>&1 &
etcd_pid=$!
pids+=($etcd_pid)
ready $etcd_url/health
"$BIN" cluster --etcd $etcd_url init --pgs 256 --replicas 3 >/dev/null
node_pids=()
for i in 0 1 2; do
  "$BIN" node --etcd $etcd_url --data-dir "$work/node$i" --listen 127.0.0.1:$((19410 + i)) \
    --log warn --compact-interval 0 --worker-threads "$NODE_THREADS" >"$work/node$i.log" 2>&1 &
  node_pids+=($!)
  pids+=($!)
done
for _ in $(seq 1 150); do
  "$BIN" cluster --etcd $etcd_url status 2>/dev/null | grep -q '"pgs_healthy": 256' && break
  sleep 0.2
done
"$BIN" gateway --etcd $etcd_url --listen 127.0.0.1:19420 --log warn >"$work/gateway.log" 2>&1 &
gw_pid=$!
pids+=($gw_pid)
ready http://127.0.0.1:19420/health/ready
etcd_before=$(cpu $etcd_pid)
loads cluster http://127.0.0.1:19420 "$gw_pid ${node_pids[*]}"
etcd_after=$(cpu $etcd_pid)
echo "each node ran $NODE_THREADS runtime thread(s); the gateway and the embedded server one per core ($(nproc))"

python3 - "$results" "$etcd_before" "$etcd_after" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["label"], r["workload"]): r for r in rows}
print(f"{'4 KiB':<6} {'embedded ops/s':>14} {'cluster ops/s':>13} {'CPU µs/op emb':>13} "
      f"{'CPU µs/op cl':>12} {'(gateway':>8} {'nodes)':>6} {'ratio':>6} {'p99 ms emb':>10} "
      f"{'p99 ms cl':>9}")
for w in ("get", "put", "batch"):
    e, c = by[("embedded", w)], by[("cluster", w)]
    rate = "samples_per_sec" if w == "batch" else "ops_per_sec"
    # Batch GET per sample: a few µs, so one decimal.
    f = ".1f" if w == "batch" else ".0f"
    gw = c["front_cpu_us_per_op"]
    print(f"{w.upper():<6} {e[rate]:>14,.0f} {c[rate]:>13,.0f} "
          f"{e['cpu_us_per_op']:>13{f}} {c['cpu_us_per_op']:>12{f}} {gw:>8{f}} "
          f"{c['cpu_us_per_op'] - gw:>6{f}} "
          f"{c['cpu_us_per_op'] / e['cpu_us_per_op']:>6.2f} {e['latency_us_p99'] / 1000:>10.1f} "
          f"{c['latency_us_p99'] / 1000:>9.1f}")
e, c = by[("embedded", "multipart")], by[("cluster", "multipart")]
mib = e["size_bytes"] / (1 << 20)
print(f"multipart uploads of {mib:.0f} MiB in 8 MiB parts, 2 at a time: "
      f"embedded {e['mb_per_sec']:.0f} MB/s, {e['cpu_us_per_op'] / mib / 1000:.2f} CPU ms/MiB; "
      f"cluster {c['mb_per_sec']:.0f} MB/s, {c['cpu_us_per_op'] / mib / 1000:.2f} CPU ms/MiB "
      f"(ratio {c['cpu_us_per_op'] / e['cpu_us_per_op']:.2f}); "
      f"p99 {e['latency_us_p99'] / 1000:.0f} / {c['latency_us_p99'] / 1000:.0f} ms")
print(f"etcd during the cluster loads: {float(sys.argv[3]) - float(sys.argv[2]):.2f} CPU s; "
      f"errors: {sum(r['errors'] for r in rows)}")
EOF
