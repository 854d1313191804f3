# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv tools kafka test test-kafka-matrix lint typecheck unit demo bench clean

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
# report in tests/test_report.py), systemd-nspawn (the unit under systemd as PID 1), btrfs-progs
# and xfsprogs (copy-on-write and delayed-free filesystems under offline deletion). The tests
# fail, never skip, without them; this installs what is missing once and is a no-op after.
# A JDK 17 and Maven run the real Kafka broker the tests start (support.kafka).
TOOLS := promtool:prometheus prometheus:prometheus strace:strace chromium:chromium \
	systemd-nspawn:systemd-container java:openjdk-17-jdk-headless mvn:maven \
	mkfs.btrfs:btrfs-progs mkfs.xfs:xfsprogs

tools:
	@missing=""; for t in $(TOOLS); do \
	  command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y --no-install-recommends $$missing; fi

# The real Kafka broker of the realkafka tests: resolved from Maven Central (cached after the
# first run under /var/cache/diskguard/kafka and ~/.m2). One line and a failure if it cannot be.
KAFKA_RUNNER := cd tests && ../$(BIN)/python -m support.kafka

kafka: venv tools
	@$(KAFKA_RUNNER) classpath

# The suite on pytest-xdist workers, two per core: most tests wait on a daemon's cycle, a
# broker or a loop disk rather than burn CPU. Tests that share a longer-lived fixture (the
# session broker and cluster, the SparkSession, a module's wheel) stay on one worker, so each
# starts once (tests/conftest.py, "parallel workers"). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))

unit: venv tools kafka
	$(BIN)/pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadgroup

test: lint typecheck unit

# The realkafka tests against every supported line: 2.8 (ZooKeeper), 3.9 (ZooKeeper and
# KRaft), 4.0 and the newest 4.x. Writes docs/kafka-matrix.md (per test) and the per-call
# table of docs/broker-calls.md. Some tests again on one line, merged over the reports the
# full runs left in build/kafka-matrix: `$(KAFKA_RUNNER).matrix --rerun --only 3.9.2:kraft
# --output ../docs/kafka-matrix.md --calls ../docs/broker-calls.md -- tests/broker/test_x.py`.
test-kafka-matrix: venv tools
	$(KAFKA_RUNNER).matrix --output ../docs/kafka-matrix.md --calls ../docs/broker-calls.md

demo: venv
	PYTHONPATH=demo:tests $(BIN)/python -m diskguard_demo

bench: venv
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info daemon/*.egg-info
