"""The training layer's own error, reported by the CLI as one line (exit 2)."""


class TrainingError(Exception):
    """A training config or data set that cannot be used as given; the message says how to fix it."""
