#!/usr/bin/env bash
# How much CPU a zero-copy send could save per batch GET sample on this machine: builds
# bench/copy_paths.c and serves random 4 KiB records of a page-cached 416 MB file into a
# loopback socket five ways (see the comment at the top of the C file), ROUNDS times each,
# alternating, so the machine's drift touches every mode alike. Needs a C compiler and
# liburing (apt-get install liburing-dev).
#
#   bench/copy_paths.sh                 # RECORDS=1000000 ROUNDS=3
#   MODES="pread mmap-copy" bench/copy_paths.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RECORDS=${RECORDS:-1000000}
ROUNDS=${ROUNDS:-3}
work=$(mktemp -d /tmp/packrat-copy.XXXXXX)
trap 'rm -rf "$work"' EXIT
cc -O3 -march=native -pthread -o "$work/copy_paths" bench/copy_paths.c -luring
# 100,000 records of a 64-byte header and 4 KiB of payload, like the benchmark's data set;
# written through the page cache and read once so every page is resident.
head -c $((100000 * (64 + 4096))) /dev/urandom >"$work/segment"
cat "$work/segment" >/dev/null
for _ in $(seq 1 "$ROUNDS"); do
  for mode in ${MODES:-pread mmap-copy mincore-copy mmap-send}; do
    "$work/copy_paths" "$work/segment" "$mode" "$RECORDS"
  done
done
