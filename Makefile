# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv tools test lint typecheck unit demo bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check daemon tests bench demo
	$(BIN)/ruff format --check daemon tests bench demo

typecheck: venv
	$(BIN)/mypy

# Debian packages the tests drive for real: Prometheus and promtool (alert rules, dashboard),
# strace (kill -9 at every file-system call of offline deletion), Chromium (renders the HTML
# report in tests/test_report.py), systemd-nspawn (the unit under systemd as PID 1). The tests
# fail, never skip, without them; this installs what is missing once and is a no-op after.
TOOLS := promtool:prometheus prometheus:prometheus strace:strace chromium:chromium \
	systemd-nspawn:systemd-container

tools:
	@missing=""; for t in $(TOOLS); do \
	  command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y --no-install-recommends $$missing; fi

unit: venv tools
	$(BIN)/pytest -q -p no:cacheprovider

test: lint typecheck unit

demo: venv
	PYTHONPATH=demo $(BIN)/python -m diskguard_demo

bench: venv
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info daemon/*.egg-info
