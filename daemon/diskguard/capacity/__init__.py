"""Capacity planning: the reserved-size method (``reserve``) and the topic configs it reads.
May import ``kafkalog``, ``config`` and ``logs``."""
