#!/usr/bin/env bash
# The one command that runs every check and test packrat has: formatting, clippy, the
# instruction guard (callgrind counts of a 4 KiB GET and PUT against bench/instructions.baseline), unit,
# property and store conformance tests, the Rust AWS SDK tests and the Python client tests
# (boto3, aws-cli) against the real binary. CI runs exactly this (see .ci/run). Needs the setup
# in the README. At the end it prints how long each step took, so growth is seen early, and
# repeats pytest's closing line last.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Python tools (pytest, boto3, aws-cli, the readers, the installed packrat_client) live in
# the virtual environment the README's setup makes; PACKRAT_VENV names another (the opt-in torch
# mode's, made from bench/requirements-torch.txt).
venv=${PACKRAT_VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "no $venv: run the README's setup (python3 -m venv .venv && .venv/bin/pip install -r tests/requirements.txt ./sdk-examples/python)" >&2
  exit 2
fi
venv=$(cd "$venv" && pwd)
export PATH="$venv/bin:$PATH"

step_names=()
step_secs=()
step_name=""
step_start=0
end_step() {
  if [ -n "$step_name" ]; then
    step_names+=("$step_name")
    step_secs+=($((SECONDS - step_start)))
  fi
  step_name=""
}
step() {
  end_step
  step_name="$*"
  step_start=$SECONDS
  printf '\n==> %s\n' "$*"
}
durations() {
  end_step
  printf '\n==> step durations\n'
  for i in "${!step_names[@]}"; do
    printf '%6ds  %s\n' "${step_secs[$i]}" "${step_names[$i]}"
  done
  printf '%6ds  total\n' "$SECONDS"
}
# On a failure too, so a run cut short still says where its time went.
trap 'status=$?; [ "$status" -eq 0 ] || durations; exit "$status"' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check

step "house rules (file sizes, no too_many_arguments, no import circles: docs/ARCHITECTURE.md)"
python3 scripts/house_rules.py

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build (the packrat binary the integration tests start)"
cargo build --workspace

step "instruction guard (callgrind: 4 KiB PUT and GET within 5% of bench/instructions.baseline)"
BASELINE=bench/instructions.baseline bash bench/instructions.sh

step "cargo test (unit, property, store conformance and Rust AWS SDK tests)"
cargo test --workspace

step "fuzz smoke run (cargo-fuzz, every target for \${PACKRAT_FUZZ_SECONDS:-10} s)"
bash scripts/fuzz.sh

step "pytest, cluster mode (the boto3, aws-cli and data-loader client tests against a gateway of etcd + 3 nodes)"
PACKRAT_TEST_TARGET=cluster "$venv/bin/python" -m pytest -q -rs \
  tests/test_objects.py tests/test_multipart.py tests/test_tagging.py tests/test_cors.py tests/test_post_object.py \
  tests/test_bucket_policy.py tests/test_bucket_acl.py tests/test_isolation.py tests/test_object_acl.py \
  tests/test_auth_checksums.py tests/test_sse.py tests/test_versioning.py tests/test_object_lock.py \
  tests/test_awscli.py tests/test_extensions.py tests/test_loaders.py

step "pytest (boto3, aws-cli, restart and kill -9 tests against the real binary)"
pytest_log=$(mktemp)
set +e
# Two test files at a time (pytest-xdist; a file's tests stay together on one worker, so its
# module fixtures are made once): most tests wait on servers, restarts and leases rather than
# compute, and this step was half of a warm run. PACKRAT_TEST_JOBS=1 runs them one by one.
# --durations: the slowest tests, so the suite's growth is seen test by test.
jobs=${PACKRAT_TEST_JOBS:-2}
parallel=()
[ "$jobs" -gt 1 ] && parallel=(-n "$jobs" --dist loadfile)
"$venv/bin/python" -m pytest -q "${parallel[@]}" --durations=15 tests "$@" 2>&1 | tee "$pytest_log"
pytest_status=${PIPESTATUS[0]}
set -e
trap - EXIT
durations
# pytest's own closing line ("N passed in ..."), last, for whoever reads a run's last line.
tail -n 1 "$pytest_log"
rm -f "$pytest_log"
exit "$pytest_status"
