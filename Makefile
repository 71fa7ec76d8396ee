# One recipe per habit. `make demo` and `make test` are the README's two set-up commands.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: venv demo test lint typecheck unit bench system-deps

$(BIN)/ioe: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,lake,nvml]'
	touch $(BIN)/ioe

venv: $(BIN)/ioe

demo: venv
	$(BIN)/ioe demo $(DEMO_ARGS)

system-deps:
	bash scripts/system-deps.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

unit: venv
	bash scripts/pytest.sh

test: system-deps venv lint typecheck
	bash scripts/pytest.sh

bench: venv
	$(BIN)/python -m bench.run_all
