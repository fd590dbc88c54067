"""The evaluation layer's own error, reported by the CLI as one line (exit 2)."""


class EvaluationError(Exception):
    """A preregistration or run directory that cannot be used as given; the message says how to fix it."""
