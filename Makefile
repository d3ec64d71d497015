# EagleGen: every command a user or CI runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
WORKERS ?= 2
# EAGLEGEN_REDIS_URL is not set here: it comes from the environment or .env (a default here
# would override the .env of a worker-only host).
# Compose v2 (the `docker compose` plugin) where installed, else v1 (`docker-compose`, the
# only one Debian packages); DOCKER_COMPOSE="docker-compose" picks one by hand.
DOCKER_COMPOSE ?= $(shell if docker compose version >/dev/null 2>&1; then echo docker compose; \
	elif command -v docker-compose >/dev/null 2>&1; then echo docker-compose; fi)
COMPOSE_BIN = $(or $(DOCKER_COMPOSE),$(error neither `docker compose` nor `docker-compose` is installed (docs/deployment.md)))
# The docker stack; TLS=1 adds docker-compose.tls.yml (Redis speaks TLS only).
COMPOSE = $(COMPOSE_BIN) -f docker-compose.yml $(if $(filter 1,$(TLS)),-f docker-compose.tls.yml)

.PHONY: redis-installed soak test-compose test-faults chaos help install install-dev demo test test-unit test-vllm test-trainers lint format bench up down logs ps enqueue worker-host worker collector flower redis clean

help:
	@echo "make demo      run the bundled prompts end to end (simulator, worker, collector)"
	@echo "make test      set up and run the test suite (on a Redis of its own)"
	@echo "make test-faults  hostile servers, paused and killed processes, a stalled Redis"
	@echo "make test-vllm the same pipeline against a real vLLM CPU server (tiny model)"
	@echo "make test-trainers  SpecForge and speculators read the exported data (own venv)"
	@echo "make lint      ruff + mypy"
	@echo "make bench     capacity benchmarks vs a baseline script (a few minutes)"
	@echo "make soak      100k zero-latency samples: worker RSS, log bytes, Redis per run"
	@echo "make up/down   docker compose stack (WORKERS=N, TLS=1); make logs, make ps"
	@echo "make test-compose  the stack for real on a docker engine (installs one if root)"
	@echo "make worker    a worker from .venv; make worker-host: docker workers on another host"

$(VENV)/.installed-core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pinned first, from PyTorch's CPU index: an open range, or PyPI's own build, would pull a
	# multi-GB CUDA build of torch. Where that index cannot be reached, the local pin is used.
	$(BIN)/pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
		--retries 0 --timeout 10 || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,train]'
	touch $@ $(VENV)/.installed-core

install: $(VENV)/.installed-core
install-dev: $(VENV)/.installed-dev

redis:
	@scripts/ensure_redis.sh

# The redis-server program, which the tests, benchmarks and the demo start on free ports of
# their own (they write no Redis they did not start, unless told: EAGLEGEN_TEST_REDIS_URL,
# --redis-url, EAGLEGEN_REDIS_URL for the demo).
redis-installed:
	@scripts/ensure_redis.sh --installed

# A Redis of its own unless EAGLEGEN_REDIS_URL is set (environment or .env): then that one,
# announced (README).
demo: install
	@[ -n "$$EAGLEGEN_REDIS_URL" ] || grep -qs '^EAGLEGEN_REDIS_URL=' .env || scripts/ensure_redis.sh --installed
	$(BIN)/eaglegen demo

test: install-dev redis-installed
	$(BIN)/pytest

# The fault tier: hostile servers, SIGSTOPped and SIGKILLed workers, Redis stalled and restarted,
# clocks moved (libfaketime), capture under faults. Kept apart so `make test` stays short.
test-faults: install-dev redis-installed
	$(BIN)/pytest -m faults

test-unit: install-dev
	$(BIN)/pytest -m "not integration"

# A real vLLM CPU server in its own venv (scripts/setup_vllm.sh). Where it cannot be
# installed the tier skips with the reason; in CI that is a failure.
test-vllm: install-dev redis-installed
	scripts/setup_vllm.sh || [ -z "$$CI" ]
	$(BIN)/pytest -m vllm tests/vllm

# SpecForge 0.2.0 and speculators 0.9.0 read `eaglegen export` output with their own data code,
# in a venv of their own (scripts/setup_trainers.sh). Where it cannot be installed the tier
# skips with the reason; in CI that is a failure.
test-trainers: install-dev
	scripts/setup_trainers.sh || [ -z "$$CI" ]
	$(BIN)/pytest -m trainers tests/trainers --timeout 900

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

worker: install redis
	$(BIN)/eaglegen worker

collector: install redis
	$(BIN)/eaglegen collect --out out/$${EAGLEGEN_RUN:-default}.jsonl

# The collector writes ./out as the directory's owner: created here, that is the caller.
up:
	mkdir -p $${EAGLEGEN_OUT_DIR:-out}
	$(COMPOSE) up -d --build --scale worker=$(WORKERS)

# make down ARGS=-v also deletes the Redis volume: every queued sample and unwritten result.
down:
	$(COMPOSE) down $(ARGS)

logs:
	$(COMPOSE) logs -f --tail=100

ps:
	$(COMPOSE) ps

# make enqueue SOURCE=my_prompts.jsonl [ARGS="--max-tokens 4096"]: a file of ./data, one shot.
enqueue:
	$(COMPOSE) run --rm producer enqueue /input/$(SOURCE) $(ARGS)

# Workers only, on another host, against the main host's Redis (EAGLEGEN_REDIS_URL in .env).
worker-host:
	$(COMPOSE_BIN) -f docker-compose.worker.yml up -d --build --scale worker=$(WORKERS)

# Flower from the same app config as the workers; FLOWER_BASIC_AUTH=user:password required.
flower: install redis
	@test -n "$$FLOWER_BASIC_AUTH" || { echo "set FLOWER_BASIC_AUTH=user:password"; exit 2; }
	$(BIN)/celery -A worker.celery_app flower --address=127.0.0.1 --port=$${FLOWER_PORT:-5555}

# make up for real: a docker engine (Debian's, installed and started where none is), base
# images (built from Debian packages where the registry is unreachable), then the stack's
# checks in tests/compose (about 3 min on 2 cores from a clean machine). Stops the engine
# again if it started it.
test-compose: install-dev
	scripts/test_compose.sh

chaos: install-dev redis-installed
	$(PY) scripts/chaos.py

# Capacity benchmarks, side by side with the baseline script, then routing by prefix cache vs
# least-loaded (each on a Redis of its own; ~5 min on 2 cores, then 77 s for routing), then what checkpoints
# cost (a second): JSON in bench/results/, a Markdown summary on stdout, figures quoted in
# docs/benchmarks.md and docs/resume.md.
bench: install-dev redis-installed
	$(PY) bench/bench_capacity.py
	$(PY) bench/bench_tokenize.py --rows 20000 --json bench/results/tokenize.json
	$(PY) bench/bench_routing.py
	$(PY) bench/bench_checkpoint.py
	$(PY) bench/bench_capture.py
	$(PY) bench/bench_verify.py --results bench/results/verify.json

# 100k zero-latency samples through 2 workers x 32 (a Redis of its own, about 8 min on 2 cores): RSS per
# worker at each 10k, log bytes per 1,000 samples, Redis bytes before and after retiring the run.
soak: install-dev redis-installed
	$(PY) bench/soak.py --samples $${SOAK_SAMPLES:-100000}

clean:
	rm -rf $(VENV) .trainers-venv .mypy_cache .ruff_cache .pytest_cache out .eaglegen
