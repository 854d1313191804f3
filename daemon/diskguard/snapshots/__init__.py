"""Usage snapshots: the record (one JSON shape), the crash-safe spool, the Kafka sink.
May import ``kafkalog.model``, ``host`` and ``logs``."""
