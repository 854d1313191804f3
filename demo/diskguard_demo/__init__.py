"""The diskguard demo: a simulated broker writing real-format segments into a sandbox, and
diskguard guarding it. Not part of the product wheel; ``make demo`` runs it from ``demo/``."""
