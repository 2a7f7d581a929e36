#!/usr/bin/env bash
# Where one server's CPU goes under a load of 4 KiB requests, natively (not under valgrind):
# `packrat serve` on a fresh data directory, KEYS objects uploaded, then $DURATION of the
# workload at $CONCURRENCY connections while `perf record -g` samples the server. Prints the
# server's CPU per operation (user and system, from /proc), the writes per group commit, and
# a table of where the samples fall: the parts of a request by the frame they run under
# (inclusive shares: user-space frames carry their kernel work), then what runs under no such
# frame (the scheduler, allocation, HTTP, tokio) by the function a sample is in.
#
#   WORKLOAD=put bench/profile.sh                 # durable 4 KiB PUTs, 64 connections
#   WORKLOAD=get CONCURRENCY=4 bench/profile.sh
#   PACKRAT_BIN=target/release/packrat bench/profile.sh
#
# Needs perf (linux-perf) and a kernel.perf_event_paranoid that lets it see the server
# (root, or 1 or less).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
WORKLOAD=${WORKLOAD:-put}
SIZE=${SIZE:-4KiB}
KEYS=${KEYS:-10000}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-64}
PORT=${PORT:-19260}
export AWS_ACCESS_KEY_ID=profilebenchkey AWS_SECRET_ACCESS_KEY=profilebench-secret-0123456789
command -v perf >/dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 2; }
work=$(mktemp -d /tmp/packrat-profile.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

PACKRAT_ROOT_ACCESS_KEY=$AWS_ACCESS_KEY_ID PACKRAT_ROOT_SECRET_KEY=$AWS_SECRET_ACCESS_KEY "$BIN" serve \
  --data-dir "$work/data" --listen 127.0.0.1:$PORT --log warn >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health/ready" >/dev/null && break
  sleep 0.2
done
load() {
  "$BIN" bench --endpoint "http://127.0.0.1:$PORT" --server-pid "$pid" --json --bucket profile \
    --size "$SIZE" --keys "$KEYS" --prefix k/ "$@"
}
load --workload get --prepare --ops 0 --concurrency 64 >/dev/null
commits() { curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^packrat_commit_batches_total/{b=$2} /^packrat_commit_jobs_total/{j=$2} END{print b, j}'; }
before=$(commits)
secs=${DURATION%s}
perf record -q -g -F 1999 -p "$pid" -o "$work/perf.data" -- sleep "$((secs + 1))" >/dev/null 2>&1 &
perf_pid=$!
load --workload "$WORKLOAD" --concurrency "$CONCURRENCY" --duration "$DURATION" >"$work/load.json"
wait "$perf_pid"
after=$(commits)
perf report -i "$work/perf.data" --children --sort sym --stdio -g none --percent-limit 0.3 2>/dev/null \
  >"$work/children.txt"
perf report -i "$work/perf.data" --no-children --sort dso,sym --stdio -g none --percent-limit 0.05 2>/dev/null \
  >"$work/self.txt"
python3 - "$work" "$before" "$after" <<'PY'
import json, re, sys
work, before, after = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
load = json.loads(open(f"{work}/load.json").read().strip().splitlines()[-1])
print(f"{load['workload']} {load['size_bytes']} bytes, {load['concurrency']} connections: {load['ops_per_sec']:.0f} ops/s, "
      f"server CPU {load['server_cpu_us_per_op']:.1f} µs/op, p50 {load['latency_us_p50']/1000:.2f} ms, "
      f"errors {load['errors']}")
if len(before) == 2 and len(after) == 2:
    batches = float(after[0]) - float(before[0])
    writes = float(after[1]) - float(before[1])
    if batches:
        print(f"group commits: {batches:.0f}, {writes / batches:.1f} writes each")

def rows(path):
    for line in open(path):
        m = re.match(r"\s*([\d.]+)%\s+(?:([\d.]+)%\s+)?(.*)$", line)
        if m:
            yield m

# Parts of a request by the frame they run under, inclusive (what a frame calls is in its
# share; a nested part is also in its parent's). The largest match of a part's pattern counts.
parts = [
    ("group commit: the segments' sync (`sync_through`)", r"ChunkStore>::sync_through$"),
    ("group commit: RocksDB's write", r"rocksdb::DBImpl::WriteImpl$"),
    ("- of which its WAL written and synced", r"rocksdb::DBImpl::WriteGroupToWAL$"),
    ("MD5 of the body (the ETag)", r"md5::compress"),
    ("the answer sent (`writev`, loopback delivery included)", r"TcpStream as std::io::Write>::write_vectored$"),
    ("the body appended to the segment (`pwritev`)", r"\bpwritev64$"),
    ("a record read (`preadv2`)", r"\bpreadv(2|64v2)$"),
    ("the request received (`recv`)", r"__libc_recv$|__x64_sys_recvfrom$"),
    ("SHA-256 (SigV4)", r"sha2::sha256"),
    ("the kernel: every system call", r"entry_SYSCALL_64_after_hwframe$"),
]
incl = []
for m in rows(f"{work}/children.txt"):
    incl.append((m.group(3).split("] ", 1)[-1].strip(), float(m.group(1))))
print()
print("| part (inclusive share of the server's samples) | % |")
print("|---|---|")
for label, pat in parts:
    share = max((v for name, v in incl if re.search(pat, name)), default=0.0)
    if share:
        print(f"| {label} | {share:.1f} |")

# User space that runs under no one frame above, by the function a sample is in (self shares).
groups = [
    ("the scheduler: threads switched out and in (in a PUT, partly under the syncs)", r"finish_task_switch"),
    ("allocation (mimalloc)", r"\bmi_|_mi_|mimalloc"),
    ("HTTP parse and encode (hyper)", r"hyper|httparse|http::"),
    ("tokio (scheduler, timers, I/O driver)", r"tokio"),
    ("memory copies (libc)", r"memcpy|memmove|memset"),
]
own = {}
for m in rows(f"{work}/self.txt"):
    rest = m.group(3)
    for label, pat in groups:
        if re.search(pat, rest):
            own[label] = own.get(label, 0.0) + float(m.group(1))
            break
for label, _ in groups:
    if own.get(label):
        print(f"| {label} (self) | {own[label]:.1f} |")
PY
