# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv test lint typecheck unit demo bench clean tools-chromium

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check daemon tests bench
	$(BIN)/ruff format --check daemon tests bench

typecheck: venv
	$(BIN)/mypy

# Headless Chromium renders the HTML report in tests/test_report.py (never skipped).
tools-chromium:
	command -v chromium || (apt-get update && apt-get install -y --no-install-recommends chromium)

unit: venv tools-chromium
	$(BIN)/pytest -q -p no:cacheprovider

test: lint typecheck unit

demo: venv
	$(BIN)/python -m diskguard.demo

bench: venv
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info daemon/*.egg-info
