"""Java ``.properties`` syntax (``diskguard.properties``), the one reader of the broker's files
and of ``diskguard aggregate --kafka-config``."""

from __future__ import annotations

from pathlib import Path

from diskguard.kafkalog.serverprops import read_properties
from diskguard.properties import parse_properties


def test_every_form_java_takes_with_its_first_line_number() -> None:
    text = (
        "# comment\n! comment\n\n  log.dirs = /a,\\\n    /b\nnode.id:3\n"
        "process.roles broker,controller\nlonely\n=no-key\nempty=\n"
    )
    assert list(parse_properties(text)) == [
        (4, "log.dirs", "/a,/b"),
        (6, "node.id", "3"),
        (7, "process.roles", "broker,controller"),
        (8, "lonely", None),
        (9, "=no-key", None),
        (10, "empty", ""),
    ]


def test_the_broker_files_keep_a_lone_key_as_empty(tmp_path: Path) -> None:
    """As Java does: a line that is only a key is that key, empty (the client settings reader
    refuses it instead)."""
    path = tmp_path / "server.properties"
    path.write_text("log.dirs=/data/kafka\nlonely\n")
    assert read_properties(path) == {"log.dirs": "/data/kafka", "lonely": ""}
