"""``python -m diskguard`` — the same as the ``diskguard`` console script."""

from diskguard.cli import main

main()
