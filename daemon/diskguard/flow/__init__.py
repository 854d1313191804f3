"""Qpid-style flow control: the pure overfull/underfull state machine, the actuators that
hold producers back (hook, quota, ACL) and the ballast file. May import ``host``, ``config``."""
