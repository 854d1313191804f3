"""``diskguard example-config`` / ``example-unit``: the shipped example config and systemd unit.

A wheel install has no checkout to copy ``config/diskguard.toml`` or
``systemd/diskguard.service`` from, so both ship as package data (``diskguard/data``, symlinks
to those two files in the repository: one source) and these commands print them unchanged,
ready to redirect into ``/etc``.
"""

from __future__ import annotations

from importlib.resources import files

import click

from diskguard.cli import no_traceback

EXAMPLE_CONFIG = "diskguard.toml"
EXAMPLE_UNIT = "diskguard.service"


def example_text(name: str) -> str:
    """The packaged file's text (``EXAMPLE_CONFIG`` or ``EXAMPLE_UNIT``)."""
    return (files("diskguard") / "data" / name).read_text(encoding="utf-8")


@click.command("example-config")
@no_traceback
def example_config() -> None:
    """Print the example config, to redirect into /etc/diskguard/diskguard.toml."""
    click.echo(example_text(EXAMPLE_CONFIG), nl=False)


@click.command("example-unit")
@no_traceback
def example_unit() -> None:
    """Print the systemd unit, to redirect into /etc/systemd/system/diskguard.service."""
    click.echo(example_text(EXAMPLE_UNIT), nl=False)
