"""diskguard: keeps a Kafka broker's disks from filling."""

__version__ = "0.1.0"
