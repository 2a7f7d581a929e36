#!/usr/bin/env bash
# The one command that runs every check and test packrat has: formatting, clippy, unit and
# property tests, the Rust AWS SDK tests and the Python client tests (boto3, aws-cli) against
# the real binary. CI runs exactly this (see .ci/run). Needs the setup in the README.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build (the packrat binary the integration tests start)"
cargo build --workspace

step "cargo test (unit, property, store conformance and Rust AWS SDK tests)"
cargo test --workspace

step "fuzz smoke run (cargo-fuzz, every target for \${PACKRAT_FUZZ_SECONDS:-20} s)"
bash scripts/fuzz.sh

step "pytest (boto3, aws-cli, restart and kill -9 tests against the real binary)"
python3 -m pytest -q tests "$@"
