#!/usr/bin/env bash
# "Feeding GPUs": a PyTorch DataLoader (4 workers, batch 256) over IMAGES JPEGs of ~100 KiB,
# read from local files (page cache warm, and dropped) and from packrat by boto3 GETs,
# s3torchconnector, packrat's map dataset (one batch GET per batch), packrat's epoch stream and
# WebDataset shards; bytes only and decoded to 224x224; the server pinned to core 1 and the
# loader to core 0 (a training host's view: PIN=0 lets them float), packrat's readers and local
# files with the page cache warm and dropped (all of it as root), ROUNDS rounds (3) in
# alternating order. Prints samples/s, the loader's and the server's CPU per sample, medians
# and spread (docs/benchmarks.md). Needs the opt-in torch environment (README): .venv-torch
# from bench/requirements-torch.txt.
#
#   bench/dataloader.sh                        # IMAGES=50000: ~5 GB of JPEGs, twice that in packrat
#   IMAGES=5000 SAMPLES=5120 ROUNDS=1 bench/dataloader.sh
#   KINDS=bytes,packed MODES="local warm,packrat map warm,packrat epoch stream warm" bench/dataloader.sh
#
# The JPEGs are kept in $WORK/images between runs (made once); the server's data is not.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${PACKRAT_BIN:-${CARGO_TARGET_DIR:-target}/debug/packrat}
VENV=${PACKRAT_VENV:-.venv-torch}
WORK=${WORK:-/tmp/packrat-dataloader}
PORT=${PORT:-19400}
export AWS_ACCESS_KEY_ID=dlbenchaccesskey AWS_SECRET_ACCESS_KEY=dlbench-secret-key-0123456789
[ -x "$VENV/bin/python" ] || { echo "no $VENV: see the README's opt-in torch mode" >&2; exit 2; }
mkdir -p "$WORK"
rm -rf "$WORK/data"
# A training host's view: the server on its own core, the loader (main loop and workers) on the
# other; PIN=0 lets both float.
if [ "${PIN:-1}" = 1 ]; then server_cpu=(taskset -c 1); loader_cpu=(taskset -c 0); else server_cpu=(); loader_cpu=(); fi
PACKRAT_ROOT_ACCESS_KEY=$AWS_ACCESS_KEY_ID PACKRAT_ROOT_SECRET_KEY=$AWS_SECRET_ACCESS_KEY "${server_cpu[@]}" "$BIN" serve \
  --data-dir "$WORK/data" --listen "127.0.0.1:$PORT" --log warn >"$WORK/server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  "$VENV/bin/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health/ready', timeout=1)" 2>/dev/null && break
  sleep 0.2
done
"${loader_cpu[@]}" "$VENV/bin/python" bench/dataloader.py --endpoint "http://127.0.0.1:$PORT" --server-pid "$pid" \
  --root "$WORK/images" --images "${IMAGES:-50000}" --samples "${SAMPLES:-20480}" \
  --decode-samples "${DECODE_SAMPLES:-5120}" --workers "${WORKERS:-4}" --batch "${BATCH:-256}" \
  --rounds "${ROUNDS:-3}" \
  ${MODES:+--modes "$MODES"} ${KINDS:+--kinds "$KINDS"} --json "$WORK/results.jsonl" "$@"
