#!/usr/bin/env bash
# Instructions a packrat server runs per request, binary A (before a change) against B (after),
# counted by valgrind's callgrind: the same count every run for the same binary and workload,
# whatever else the machine does, so a cost of 1% shows where bench/ab.sh's wall-clock rounds
# (20-35% apart from one another on this machine) cannot see it. Each side: a server under
# callgrind on a fresh data directory, KEYS objects of SIZE uploaded and one uninstrumented
# pass of the workload (caches warm), then OPS requests counted. Prints per workload the
# instructions per request of A and B and their ratio, then the functions whose own
# instructions per request changed most.
#
#   PACKRAT_A=/tmp/packrat-before PACKRAT_B=target/debug/packrat bench/instructions.sh
#   OPS=4000 WORKLOADS="get" TOP=40 bench/instructions.sh
#
# Without PACKRAT_A only B is counted. With BASELINE=FILE (lines `WORKLOAD INSTRUCTIONS`, as
# bench/instructions.baseline keeps them) it fails when B runs more than 5% (GROWTH_MAX) over
# the baseline per request: the guard scripts/test.sh runs, so that a feature cannot add cost
# to the small request unseen. A figure well under its baseline is reported, to be lowered.
#
# With NGINX=1 (Debian's nginx package) the GET and HEAD workloads also count nginx serving the
# same KEYS files of SIZE from a directory (one process, sendfile on, no access log), driven by
# the same load generator, and print packrat's count over nginx's: the floor a static file
# server sets for a small GET.
#
#   NGINX=1 WORKLOADS="get head" bench/instructions.sh     # with PACKRAT_A or BASELINE
#
# Needs valgrind (Debian's package). Under callgrind a server runs about 50 times slower; the
# default (2,000 PUTs and 4,000 GETs per side) takes about a minute in all.
set -euo pipefail
cd "$(dirname "$0")/.."

A=${PACKRAT_A:-}
B=${PACKRAT_B:-${CARGO_TARGET_DIR:-target}/debug/packrat}
WORKLOADS=${WORKLOADS:-"put get"}
KEYS=${KEYS:-500}
SIZE=${SIZE:-4KiB}
OPS=${OPS:-}
TOP=${TOP:-15}
# Requests in flight. A PUT's count depends on how many share a group commit, which depends on
# timing: with one at a time every PUT commits alone and the count repeats (the guard's way).
CONCURRENCY=${CONCURRENCY:-4}
BASELINE=${BASELINE:-}
GROWTH_MAX=${GROWTH_MAX:-0.05}
[ -n "$A" ] || [ -n "$BASELINE" ] || { echo "set PACKRAT_A (the binary before a change) or BASELINE" >&2; exit 2; }
sides="B"; [ -n "$A" ] && sides="A B"
failed=0
PORT=${PORT:-19280}
AK=instraccesskey
SK=instr-secret-key-0123456789
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
work=$(mktemp -d /tmp/packrat-instr.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

load() { # args... (the load generator is B's `packrat bench`, so only the server changes)
  AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK "$B" bench --endpoint "http://127.0.0.1:$PORT" \
    --bucket instr --size "$SIZE" --keys "$KEYS" --prefix k/ --concurrency "$CONCURRENCY" --duration 3600s "$@" >/dev/null 2>&1
}

ready() { # url: waits for the server under callgrind to answer it
  for _ in $(seq 1 300); do
    python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" 2>/dev/null && return 0
    sleep 0.5
  done
}

counted() { # workload ops label: warms the server `$pid` up, counts `ops` requests, stops it
  local w=$1 ops=$2 label=$3
  load --workload "$w" --ops 500
  callgrind_control -i on "$pid" >/dev/null 2>&1
  load --workload "$w" --ops "$ops"
  callgrind_control -i off "$pid" >/dev/null 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  # The count is dumped: a stop that a server under valgrind sleeps through (nginx, at
  # times) is forced.
  kill "$pid"
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
  echo "== $w $label: $ops requests counted" >&2
}

count_nginx() { # workload ops: nginx under callgrind serving the same keys as files
  local w=$1 ops=$2 n=$work/nginx
  command -v nginx >/dev/null || { echo "NGINX=1 needs nginx (apt-get install nginx)" >&2; exit 2; }
  [ -f "$n/nginx.conf" ] || bench/nginx_site.py "$n" "$PORT" instr "$KEYS" "$SIZE"
  # (nginx reads an NGINX variable as sockets handed over by an upgrade: not ours.)
  env -u NGINX valgrind --tool=callgrind --instr-atstart=no ${CALLGRIND_OPTS:-} \
    --callgrind-out-file="$work/$w-N.out" nginx -c "$n/nginx.conf" -p "$n" >"$work/nginx-$w.log" 2>&1 &
  pid=$!
  ready "http://127.0.0.1:$PORT/instr/k/00000000"
  counted "$w" "$ops" nginx
}

for w in $WORKLOADS; do
  ops=${OPS:-$([ "$w" = put ] && echo 2000 || echo 4000)}
  for side in $sides; do
    bin=$A; [ "$side" = B ] && bin=$B
    rm -rf "$work/data"
    PACKRAT_ROOT_ACCESS_KEY=$AK PACKRAT_ROOT_SECRET_KEY=$SK valgrind --tool=callgrind \
      --instr-atstart=no ${CALLGRIND_OPTS:-} --callgrind-out-file="$work/$w-$side.out" \
      "$bin" serve --data-dir "$work/data" --listen 127.0.0.1:$PORT --log warn \
      >"$work/server-$w-$side.log" 2>&1 &
    pid=$!
    ready "http://127.0.0.1:$PORT/health/ready"
    load --workload put --prepare --ops 0
    counted "$w" "$ops" "$side ($bin)"
  done
  if [ "${NGINX:-0}" = 1 ] && { [ "$w" = get ] || [ "$w" = head ]; }; then
    count_nginx "$w" "$ops"
  fi
  # The dump taken while counting (the one at exit holds nothing: counting was off).
  python3 - "$w" "$ops" "$TOP" "$work/$w-A.out.1" "$work/$w-B.out.1" "$BASELINE" "$GROWTH_MAX" <<'PY' || failed=1
import collections, re, subprocess, sys
import os
work, ops, top, fa, fb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
baseline, growth_max = sys.argv[6], float(sys.argv[7])
def own(path):
    """Instructions per function (its own, inlined code included), from callgrind_annotate."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    start = next(i for i, l in enumerate(out) if "file:function" in l) + 2
    per = collections.Counter()
    for line in out[start:]:
        if line.startswith("-----"):
            break
        m = re.match(r"\s*([\d,]+)\s+\([\s\d.]+%\)\s+(.*)", line)
        if not m:
            continue
        name = m.group(2).split(" [")[0]
        where, _, fn = name.partition(":")
        name = fn if fn and where.endswith((".rs", ".S", ".c", ".h", ".cc", "???")) else name
        per[name] += int(m.group(1).replace(",", ""))
    return per
b = own(fb)
tb = sum(b.values()) / ops
fn = fb.replace("-B.out.1", "-N.out.1")
if os.path.exists(fn):
    tn = sum(own(fn).values()) / ops
    print(f"{work}: nginx {tn:,.0f} instructions per request (a file of the same size); packrat B {tb:,.0f}, {tb / tn:.2f}x nginx")
base = {}
if baseline:
    base = dict(l.split()[:2] for l in open(baseline) if l.strip() and not l.startswith("#"))
if work in base:
    want = float(base[work])
    ratio = tb / want
    print(f"{work}: {tb:,.0f} instructions per request, baseline {want:,.0f} ({ratio:.4f})")
    if ratio > 1 + growth_max:
        print(f"{work}: more than {growth_max:.0%} over the baseline: find the cost (PACKRAT_A=<the binary before> "
              f"bench/instructions.sh shows the functions that grew) or, if it is worth it, raise "
              f"{baseline} in the same commit and say why", file=sys.stderr)
        sys.exit(1)
    if ratio < 1 - growth_max:
        print(f"{work}: well under the baseline: lower it in {baseline} to keep the gain")
if not os.path.exists(fa):
    sys.exit(0)
a = own(fa)
ta = sum(a.values()) / ops
print(f"\n{work} ({ops} requests): instructions per request A {ta:,.0f}, B {tb:,.0f}, B/A {tb / ta:.4f}")
print(f"| change/request | A | B | function |\n|---|---|---|---|")
names = sorted(set(a) | set(b), key=lambda k: -abs(b[k] - a[k]))
for k in names[:top]:
    print(f"| {(b[k] - a[k]) / ops:+,.0f} | {a[k] / ops:,.0f} | {b[k] / ops:,.0f} | `{k[:110]}` |")
PY
done
exit $failed
