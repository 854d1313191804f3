"""KIP-61 retention: the pure planner, and the one cycle that deletes through an Executor, audited.
planner, mode, reclaim: pure (kafkalog.model). Others: kafkalog broker capacity host config logs."""
