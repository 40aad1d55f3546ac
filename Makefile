# kbv: `make demo` and `make test` work on a fresh machine with nothing but Python.
# Where python3 already has torch (any GPU box), the venv sees it and torch is not reinstalled.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel; a bare `torch` would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0
DEMO_RUN ?= runs/demo

.PHONY: install test test-gpu demo clean sandbox

$(BIN)/python:
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
		echo "python3 has torch: the venv will use it"; \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV); \
	fi

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@$(BIN)/python -c "import setuptools" 2>/dev/null || $(BIN)/pip install -q setuptools wheel
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q --no-build-isolation -e '.[test]'
	@touch $@

install: $(VENV)/.installed

test: install
	$(BIN)/python -m pytest -q

test-gpu: install
	$(BIN)/python -m pytest -q -m gpu

# Candidates run in bubblewrap where it can be had: as root with apt (a fresh Debian/Ubuntu box, CI),
# the demo installs it; elsewhere it runs with the strongest isolation available, and says which.
sandbox:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null \
		|| echo "bubblewrap is not installed: candidates run with weaker isolation (kbv says which)"; }

demo: install sandbox
	$(BIN)/kbv eval examples/ --problems smoke --protocol both --device auto --timer-budget 2 --run $(DEMO_RUN)
	@$(BIN)/kbv report $(DEMO_RUN) --format html --out $(DEMO_RUN)/report.html >/dev/null
	@echo "HTML report: $(abspath $(DEMO_RUN))/report.html"

clean:
	rm -rf $(VENV) $(DEMO_RUN) build src/*.egg-info
