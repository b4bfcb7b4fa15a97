# trtllm-gateway developer entry points.
PYTHON ?= python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test

# torch first, pinned (pip would otherwise pick whatever the index resolves), then the package + test extras.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install torch==2.13.0
	$(PYTHON) -m pip install -e '.[test]'

# Serves the embedded demo model (no --model) on http://$(HOST):$(PORT).
serve: install
	$(PYTHON) -m gateway serve --host $(HOST) --port $(PORT)

test: install
	$(PYTHON) -m pytest
