#!/usr/bin/env bash
# Where one server's CPU goes under a load of 4 KiB requests, natively (not under valgrind):
# `packrat serve` on a fresh data directory, KEYS objects uploaded, then $DURATION of the
# workload at $CONCURRENCY connections while `perf record -g` samples the server. Prints the
# server's CPU per operation (user and system, from /proc), the writes per group commit, and
# a table of where the samples fall: the kernel by the system call that entered it (its
# call chains are whole), user space by the function the sample is in, in groups.
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

# The kernel, by the system call (or interrupt) it was entered for: inclusive shares.
entries = {
    "fdatasync (the group commit's data sync)": ["__x64_sys_fdatasync", "__x64_sys_fsync"],
    "writes to files (pwritev, RocksDB's WAL)": ["__x64_sys_pwritev", "__x64_sys_pwritev2", "__x64_sys_pwrite64", "__x64_sys_write"],
    "socket receive (recvfrom, read)": ["__x64_sys_recvfrom", "__x64_sys_read", "__x64_sys_readv"],
    "socket send (sendto, writev)": ["__x64_sys_sendto", "__x64_sys_writev", "__x64_sys_sendmsg"],
    "reads of files (preadv2)": ["__x64_sys_preadv2", "__x64_sys_pread64", "__x64_sys_preadv"],
    "futex (threads waking each other)": ["__x64_sys_futex"],
    "epoll": ["__x64_sys_epoll_wait", "__x64_sys_epoll_ctl", "__x64_sys_epoll_pwait"],
    "accept, close and the rest of syscalls": ["__x64_sys_accept4", "__x64_sys_close"],
    "interrupts and softirqs (loopback delivery)": ["asm_common_interrupt", "asm_sysvec_apic_timer_interrupt", "__do_softirq", "do_softirq"],
}
incl = {}
for m in rows(f"{work}/children.txt"):
    name = m.group(3).split("] ", 1)[-1].strip()
    incl[name] = float(m.group(1))
print()
print("| where (inclusive share of the server's samples) | % |")
print("|---|---|")
kernel_total = incl.get("entry_SYSCALL_64_after_hwframe", 0.0)
for label, names in entries.items():
    share = sum(incl.get(n, 0.0) for n in names)
    if share:
        print(f"| kernel: {label} | {share:.1f} |")
print(f"| kernel: every system call | {kernel_total:.1f} |")

# User space, by the function a sample is in (self shares), in groups.
groups = [
    ("MD5 (ETags)", r"md5|Md5"),
    ("SHA-256 (SigV4, payload hashes)", r"sha2|sha256|Sha256"),
    ("CRC32C", r"crc32c"),
    ("RocksDB", r"rocksdb|leveldb|^_ZN7rocksdb"),
    ("HTTP (hyper, h1 parse and encode)", r"hyper|httparse|http::"),
    ("SigV4 other (canonical request, HMAC)", r"sigv4|canonical|hmac|Hmac"),
    ("allocation (mimalloc)", r"mi_|mimalloc"),
    ("tokio (scheduler, timers, I/O driver)", r"tokio"),
    ("memory copies and clears (libc)", r"memcpy|memmove|memset"),
]
user = {}
other = 0.0
for m in rows(f"{work}/self.txt"):
    rest = m.group(3)
    if "[k]" in rest:
        continue
    share = float(m.group(1))
    for label, pat in groups:
        if re.search(pat, rest):
            user[label] = user.get(label, 0.0) + share
            break
    else:
        other += share
for label, _ in groups:
    if user.get(label):
        print(f"| user: {label} | {user[label]:.1f} |")
print(f"| user: everything else | {other:.1f} |")
PY
