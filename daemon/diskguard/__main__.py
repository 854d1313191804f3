"""``python -m diskguard`` — the same as the ``diskguard`` console script."""

from diskguard.launch import main

main()
