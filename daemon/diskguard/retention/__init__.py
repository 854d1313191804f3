"""KIP-61 retention: the pure planner, and the one cycle that deletes through an Executor, audited.
planner, limits, mode, reclaim, growthpeak, setaside, waittrace: pure (kafkalog.model).
Others: kafkalog broker capacity host config configschema logs."""
