# kiln: two commands set up a fresh machine.
#   make run   - venv + runtime deps, then the main job on the default model
#   make test  - venv + dev deps + bundled models, then the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
MODEL  ?= smollm2-135m

.PHONY: setup dev models test run clean

setup: $(VENV)/.setup-stamp
$(VENV)/.setup-stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

dev: $(VENV)/.dev-stamp
$(VENV)/.dev-stamp: $(VENV)/.setup-stamp
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

models: setup
	$(BIN)/kiln models fetch --all

test: dev models
	$(BIN)/pytest

# Until the C backend lands, the main job is the planned memory layout of the default model.
run: setup
	$(BIN)/kiln layout $(MODEL) --ctx 2048

clean:
	rm -rf $(VENV) build *.egg-info
