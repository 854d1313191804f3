"""Flow control: the pure overfull/underfull state machine (``state``), the actuators holding
producers back (``actuator``: hook, kafkaquota, kafkaacl, run by ``reconcile``) and the ballast.
``state`` imports only ``kafkalog.model``; the edges may import ``config``, ``host``, ``logs``."""
