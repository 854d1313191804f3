"""The shipped systemd unit: systemd's own verifier, its security review, and the sandbox's
one setting that could break the daemon at runtime (MemoryDenyWriteExecute).

``systemd-analyze verify`` exits 0 on an unknown key or a misspelt value and only *warns* on
stderr, so the test demands an empty stderr — and proves, with a deliberately broken copy,
that this check catches such mistakes here. verify also requires ExecStart's binary to exist,
so the copy under test points it at this venv's ``diskguard``; a missing ``kafka`` user is
not checked by verify (it is resolved only when the unit starts).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

UNIT = Path(__file__).parents[2] / "systemd" / "diskguard.service"
INSTALLED_BINARY = "/usr/local/bin/diskguard"
VENV_BINARY = Path(sys.executable).parent / "diskguard"
#: ``systemd-analyze security`` exposure x10 (1.7 at the time of writing; 2.0 = "OK" band).
MAX_EXPOSURE = 20


def _analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail("systemd-analyze not installed (apt-get install systemd)", pytrace=False)
    return path


def _copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit as shipped, with ExecStart pointed at a binary that exists here."""
    source = UNIT.read_text() if text is None else text
    assert INSTALLED_BINARY in source
    unit = tmp_path / "diskguard.service"
    unit.write_text(source.replace(INSTALLED_BINARY, str(VENV_BINARY)))
    return unit


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_verify_is_clean(tmp_path: Path) -> None:
    assert VENV_BINARY.exists()
    result = _verify(_copy(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr


@pytest.mark.parametrize(
    ("mistake", "replacement", "expected"),
    [
        ("WatchdogSec=30", "WatchdogSecs=30", "Unknown key"),
        ("Type=notify", "Type=notfiy", "Failed to parse"),
        ("RestrictAddressFamilies=AF_UNIX", "RestrictAddressFamilies=AF_UNIKS", "address family"),
        ("ExecReload=/bin/kill", "ExecReload=/bin/kil", "not executable"),
    ],
)
def test_verify_catches_mistakes(
    tmp_path: Path, mistake: str, replacement: str, expected: str
) -> None:
    """Negative control: the clean-verify test above would fail on these real mistakes."""
    text = UNIT.read_text()
    assert mistake in text
    result = _verify(_copy(tmp_path, text.replace(mistake, replacement, 1)))
    assert result.returncode != 0 or result.stderr != ""
    assert expected in result.stderr


def test_required_directives() -> None:
    d = _directives(UNIT.read_text())
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "ExecStart": f"{INSTALLED_BINARY} run -c /etc/diskguard/diskguard.toml",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "WatchdogSec": "30",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
        "TimeoutStopSec": "20",
        "User": "kafka",
        "Group": "kafka",
        "StateDirectory": "diskguard",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "SystemCallArchitectures": "native",
        "WantedBy": "multi-user.target",
    }
    for key, value in expected.items():
        assert d.get(key) == [value], f"{key}: {d.get(key)}"
    assert "-/var/lib/kafka" in d["ReadWritePaths"]
    # The stop timeout must leave the daemon time to finish a cycle but beat systemd's default.
    assert int(d["TimeoutStopSec"][0]) < 90
    # Nothing may bind the guard's life to the broker's: it must outlive a broker crash.
    assert not {"Requires", "BindsTo", "PartOf"} & set(d)


def test_security_exposure_is_ok(tmp_path: Path) -> None:
    unit = _copy(tmp_path)
    result = subprocess.run(
        [_analyze(), "security", "--offline=true", f"--threshold={MAX_EXPOSURE}", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert result.returncode == 0, f"exposure {match.group(1)} above {MAX_EXPOSURE / 10}"


# Run in a child under prctl(PR_SET_MDWE): the kernel's own MemoryDenyWriteExecute.
MDWE_CHILD = textwrap.dedent(
    """
    import ctypes, mmap, os, sys, tempfile, time, urllib.request
    PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_SET_MDWE) failed: errno {ctypes.get_errno()}")
    try:  # negative control: W+X memory must now be refused
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except OSError:
        pass
    else:
        sys.exit("MDWE not enforced: a W+X mapping succeeded")

    import diskguard.cli  # every command module, as `diskguard run` loads them
    from diskguard import daemon
    from diskguard.host import sdnotify
    from diskguard.metrics import Metrics
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from inotify_simple import INotify, flags

    admin = AdminClient({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    producer.poll(0.1)
    metrics = Metrics()
    _, port = metrics.start("127.0.0.1:0")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    assert b"diskguard_build_info" in body
    metrics.stop()
    with tempfile.TemporaryDirectory() as d:
        inotify = INotify()
        inotify.add_watch(d, flags.CREATE)
        open(os.path.join(d, "x"), "w").close()
        seen = inotify.read(timeout=5000)
        inotify.close()
        assert seen, "no inotify event under MDWE"
    print("mdwe-ok")
    """
)


def test_daemon_runs_under_memory_deny_write_execute() -> None:
    result = subprocess.run(
        [sys.executable, "-c", MDWE_CHILD], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("mdwe-ok")
