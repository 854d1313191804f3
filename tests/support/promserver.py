"""A real Prometheus server (the ``prometheus`` binary) on a loopback port (test helper).

The rules and the dashboard are only proven by the real query engine: a mock would accept
any expression. Missing binaries fail the test (``pytest.fail``), never skip it: ``make
test`` installs them (the Makefile's ``tools`` target).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from support.net import free_port


def require(tool: str) -> str:
    """The path of ``tool``, or fail the test naming the package that provides it."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(
            f"{tool} not found: install Debian's prometheus package "
            "(make tools, or apt-get install prometheus)",
            pytrace=False,
        )
    return path


def _get_json(url: str, timeout: float = 5.0) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        # The API answers errors (bad_data, execution) with 4xx/5xx and a JSON body.
        data = json.loads(exc.read())
    return data


class PrometheusServer:
    """``prometheus`` scraping ``targets`` every second and evaluating ``rule_files`` every
    second, with its TSDB under ``workdir``; ``stop()`` (or the context manager) ends it."""

    def __init__(
        self, workdir: Path, targets: list[str], rule_files: list[Path] | None = None
    ) -> None:
        self.binary = require("prometheus")
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "prometheus.yml"
        rules = "".join(f"  - {json.dumps(str(p))}\n" for p in rule_files or [])
        self.config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            + ("rule_files:\n" + rules if rules else "")
            + "scrape_configs:\n"
            "  - job_name: diskguard\n"
            "    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""
        self._start()

    def _start(self) -> None:
        # A free port can be taken between the probe and prometheus' bind: try a few.
        for _attempt in range(3):
            port = free_port()
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={self.config}",
                        f"--storage.tsdb.path={self.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            self.base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(self.base + "/-/ready", timeout=1) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
                time.sleep(0.1)
            self.stop()
        pytest.fail(f"prometheus did not become ready:\n{self.log_tail()}", pytrace=False)

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def query(self, expr: str) -> dict[str, Any]:
        """``/api/v1/query`` at now: the whole JSON answer (``status``, ``data``/``error``)."""
        return _get_json(self.base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))

    def value(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """The instant vector ``expr`` evaluates to, as (labels, value) pairs."""
        answer = self.query(expr)
        assert answer["status"] == "success", answer
        return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts (``/api/v1/alerts``); a resolved alert is not listed."""
        answer = _get_json(self.base + "/api/v1/alerts")
        assert answer["status"] == "success", answer
        alerts: list[dict[str, Any]] = answer["data"]["alerts"]
        return alerts

    def wait_until(self, what: str, check: Any, timeout: float) -> Any:
        """Poll ``check()`` until it returns something truthy; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout}s\n{self.log_tail()}")
            time.sleep(0.25)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
