"""The diskguard demo: a real Kafka broker on a disk of its own, the daemon guarding it, a
rescue, the Spark report. Not part of the product wheel; ``make demo`` runs it from ``demo/``
with the project's Kafka harness (``tests/support/kafka``) on ``PYTHONPATH``."""
