"""The ``diskguard`` console script's entry point (and ``python -m diskguard``): what must
happen before the command line itself (``cli``, click) loads.

Why a module of its own: ``plan``'s worker is forked at the command's first moment
(``planstart``), before click and the command's modules are imported: ~0.1 s of a
warm ``plan`` that its second core otherwise spent waiting.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point: ``plan``'s worker started, then the command line."""
    if sys.argv[1:2] == ["plan"]:
        from diskguard import planstart

        planstart.start(sys.argv[2:])
    from diskguard.cli import main as command_line

    command_line()
