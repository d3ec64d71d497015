# EagleGen: every command a user or CI runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
WORKERS ?= 2
export EAGLEGEN_REDIS_URL ?= redis://127.0.0.1:6379/0

.PHONY: chaos help install install-dev demo test test-unit lint format bench up down logs ps worker collector flower redis clean

help:
	@echo "make demo      run the bundled prompts end to end (simulator, worker, collector)"
	@echo "make test      set up and run the test suite (needs/starts Redis)"
	@echo "make lint      ruff + mypy"
	@echo "make up/down   docker compose stack; make worker: a worker for another machine"

$(VENV)/.installed-core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pinned first: an open range would pull a multi-GB CUDA build of torch.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,train]'
	touch $@ $(VENV)/.installed-core

install: $(VENV)/.installed-core
install-dev: $(VENV)/.installed-dev

redis:
	@scripts/ensure_redis.sh

demo: install redis
	$(BIN)/eaglegen demo

test: install-dev redis
	$(BIN)/pytest

test-unit: install-dev
	$(BIN)/pytest -m "not integration"

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

up:
	docker compose up -d --scale worker=$(WORKERS)

down:
	docker compose down

logs:
	docker compose logs -f --tail=100

ps:
	docker compose ps

chaos: install-dev
	$(PY) scripts/chaos.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache out .eaglegen
