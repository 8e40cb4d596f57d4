# The two set-up commands of the README. Both work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# A stamp per extra so that `make test` after `make demo` still installs the test extras.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

# `assay warmup` compiles the monitor's and the KNN certifier's kernels once (about 20 s on a fresh machine; a second when
# numba's cache already has them), so that no later command waits for the compiler.
demo: $(VENV)/.installed
	$(BIN)/assay warmup
	$(BIN)/assay demo

# pytest: two workers stealing work from each other (no idle worker at the end), and the 25 slowest
# tests listed so that CI's log shows where the suite's time goes.
test: $(VENV)/.installed-test
	bash tests/system_setup.sh
	$(BIN)/assay warmup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25

clean:
	rm -rf $(VENV) build src/*.egg-info
