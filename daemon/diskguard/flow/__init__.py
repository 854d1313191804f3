"""Flow control: the pure overfull/underfull state machine (``state``), the actuators holding
producers back (``actuator``: hook, kafkaquota, kafkaacl, run by ``reconcile``), the holds the
guards of a cluster share (``holds``, pure; ``holdsregistry``, ``sharedholds``) and the ballast.
``state`` and ``holds`` import only ``kafkalog.model``; the edges may import ``config``,
``host``, ``kafkalog``, ``logs``, ``broker.errors`` (Kafka errors in one line) and
``broker.kafkapython`` (the one kafka-python client)."""
