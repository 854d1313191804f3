"""KIP-61 retention: the pure planner (which segments go, globally oldest first) and the one
cycle that scans, plans and deletes through an executor (broker or files), with its audit.
May import ``kafkalog``, ``broker``, ``capacity``, ``host``, ``config`` and ``logs``."""
