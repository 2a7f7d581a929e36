#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-fuzz, libFuzzer, AddressSanitizer) of every parser that sees
# network or disk bytes: TAR, on-disk records and segment headers, the erasure codec, XML
# bodies, SigV4 headers and presigned queries, Range headers, batch GET requests and the
# aws-chunked body decoder. Targets are in fuzz/fuzz_targets; the parsers are compiled from the
# gateway's own source files, without the index or RocksDB, so a build takes about a minute.
#
#   scripts/fuzz.sh            # every target for 20 s (the smoke run scripts/test.sh does)
#   scripts/fuzz.sh 600        # every target for 10 minutes
#
# cargo-fuzz passes nightly-only flags (-Zsanitizer=address) to rustc; only the stable
# toolchain exists here, so RUSTC_BOOTSTRAP=1 lets it accept them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
per_target=${1:-${PACKRAT_FUZZ_SECONDS:-20}}
if ! command -v cargo-fuzz >/dev/null; then
  cargo install --locked cargo-fuzz@0.13.2
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
for t in $(cargo fuzz list); do
  mkdir -p "corpus/$t"
  out=$(cargo fuzz run -O "$t" -- -max_total_time="$per_target" -print_final_stats=1 2>&1) || {
    echo "$out" | tail -40
    echo "fuzz target $t FAILED (crash input saved under fuzz/artifacts/$t)" >&2
    exit 1
  }
  runs=$(echo "$out" | sed -n 's/^stat::number_of_executed_units: *//p' | tail -1)
  cov=$(echo "$out" | grep -o 'cov: [0-9]*' | tail -1)
  echo "fuzz $t: $runs executions in ${per_target}s, $cov, 0 crashes"
done
