"""How the demo ends early: it cannot run here (exit 2), or a phase's wait ran out (exit 1)."""


class Refused(Exception):
    """The demo cannot run here (not root, no Java, no broker jars, a foreign ``--dir``):
    one line, exit 2."""


class Stalled(Exception):
    """A phase's bounded wait ran out, or a step failed: the message says what did not
    happen (exit 1)."""
