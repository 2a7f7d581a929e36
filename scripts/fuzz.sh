#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-fuzz, libFuzzer, AddressSanitizer) of every parser that sees
# network or disk bytes: TAR, on-disk records, segment headers and index records, the erasure
# codec, XML bodies (tagging and lifecycle included), bucket policies (JSON, and their
# evaluation), SigV4 and SigV2 authentication (signed requests accepted, tampered ones refused),
# request headers (metadata, tagging, checksums, conditions, copy source), Range headers, batch
# GET requests, routing and the aws-chunked body decoder with real chunk signatures. Targets are in fuzz/fuzz_targets; they use the gateway
# library and the index's record encodings without RocksDB, so a build takes about a minute.
# Each target starts from its checked-in seeds (fuzz/seeds/TARGET, read only) and the local
# corpus it grows (fuzz/corpus/TARGET, not checked in).
#
#   scripts/fuzz.sh            # every target for 10 s (the smoke run scripts/test.sh does)
#   scripts/fuzz.sh 600        # every target for 10 minutes
#   PACKRAT_FUZZ_JOBS=1 ...    # one target at a time (default: two at once)
#
# cargo-fuzz passes nightly-only flags (-Zsanitizer=address) to rustc; only the stable
# toolchain exists here, so RUSTC_BOOTSTRAP=1 lets it accept them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
per_target=${1:-${PACKRAT_FUZZ_SECONDS:-10}}
if ! command -v cargo-fuzz >/dev/null; then
  cargo install --locked cargo-fuzz@0.13.2
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
# Two targets at a time (each libFuzzer process uses one core; CI has two), each into its own
# log; the summaries print in the targets' order.
logs=$(mktemp -d)
run_one() {
  t=$1
  mkdir -p "corpus/$t"
  [ -d "seeds/$t" ] || { echo "fuzz target $t has no seeds: add some under fuzz/seeds/$t" > "$logs/$t.fail"; return 1; }
  cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$per_target" -print_final_stats=1 \
    > "$logs/$t.log" 2>&1 || { touch "$logs/$t.fail"; return 1; }
}
export -f run_one
export logs per_target
targets=$(cargo fuzz list)
echo "$targets" | xargs -P "${PACKRAT_FUZZ_JOBS:-2}" -I{} bash -c 'run_one "$1"' _ {} || true
failed=0
for t in $targets; do
  if [ -e "$logs/$t.fail" ]; then
    cat "$logs/$t.fail" 2>/dev/null
    tail -40 "$logs/$t.log" 2>/dev/null || true
    echo "fuzz target $t FAILED (crash input saved under fuzz/artifacts/$t)" >&2
    failed=1
    continue
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$logs/$t.log" | tail -1)
  echo "fuzz $t: $runs executions in ${per_target}s, $cov, 0 crashes"
done
rm -rf "$logs"
exit "$failed"
