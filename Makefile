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

# The main job: compile the default model (cached after the first run) and stream a greedy continuation.
PROMPT ?= Here is a short story about a robot who learns to paint:
run: setup
	$(BIN)/kiln run $(MODEL) -p "$(PROMPT)" -n 64 --temp 0 --repeat-penalty 1.1

clean:
	rm -rf $(VENV) build *.egg-info
