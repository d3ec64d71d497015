#!/usr/bin/env bash
# Rebuild tests/fixtures/trainers/records.jsonl with the real pipeline: the simulator, a worker
# and a collector over Redis, the bundled prompts enqueued three ways. Needs Redis and .venv.
#   thinking on  : 40 MT-Bench (two turns) + 40 Vicuna-bench prompts, reasoning in every turn
#   thinking off : 20 MT-Bench prompts, --no-thinking, with a system prompt
#   cut turns    : 20 MT-Bench prompts, --max-tokens 64 (finish_reason "length", cut in the reasoning or the answer)
# Usage: tests/trainers/build_fixture.sh [redis-url]   (default: a redis-server of its own)
set -euo pipefail
cd "$(dirname "$0")/../.."
port=18716
stamp=$(date +%s)
export EAGLEGEN_ENDPOINTS="http://127.0.0.1:$port/v1"
# Text only: the tier tokenizes with other families' tokenizers, which the simulator's token
# ids would not match (eaglegen tokenize prefers a record's ids).
export EAGLEGEN_TOKEN_IDS=off
bin=.venv/bin/eaglegen
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

if [ -n "${1:-}" ]; then
  export EAGLEGEN_REDIS_URL="$1"
else  # a Redis of its own on a free port, nothing kept on disk
  rport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    >"$work/redis.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export EAGLEGEN_REDIS_URL="redis://127.0.0.1:$rport/0"
fi

$bin simulate --port "$port" --time-per-token 0 --max-answer-tokens 96 --reasoning-tokens 48 \
  >"$work/sim.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.1; done

generate() {  # run-name, then enqueue arguments
  local run=$1-$stamp; shift
  EAGLEGEN_RUN=$run $bin worker --concurrency 16 --loglevel WARNING >"$work/$run.worker.log" 2>&1 &
  local worker=$!
  EAGLEGEN_RUN=$run $bin enqueue "$@"
  for _ in $(seq 600); do
    EAGLEGEN_RUN=$run $bin status --json | python3 -c \
      'import json,sys; s=json.load(sys.stdin); sys.exit(0 if s["done"]+s["failed"]==s["total"] else 1)' \
      && break
    sleep 0.2
  done
  EAGLEGEN_RUN=$run $bin collect --once --out "$work/$run.jsonl"
  kill "$worker"; wait "$worker" || true
}

generate fixture-thinking data/mt_bench_question.jsonl --limit 40 --max-tokens 512
generate fixture-vicuna data/vicuna_bench_question.jsonl --limit 40 --max-tokens 512
generate fixture-nothink data/mt_bench_question.jsonl --limit 20 --no-thinking \
  --system "Answer briefly."
generate fixture-cut data/mt_bench_question.jsonl --limit 20 --max-tokens 64 \
  --system "Answer in one line."
cat "$work"/fixture-thinking-$stamp.jsonl "$work"/fixture-vicuna-$stamp.jsonl \
  "$work"/fixture-nothink-$stamp.jsonl "$work"/fixture-cut-$stamp.jsonl >tests/fixtures/trainers/records.jsonl
wc -l tests/fixtures/trainers/records.jsonl
