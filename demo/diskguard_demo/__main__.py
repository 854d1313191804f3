"""``python -m diskguard_demo`` (what ``make demo`` runs)."""

import sys

from diskguard_demo.demo import main

sys.exit(main())
