"""Errors the CLI reports as one line with exit code 2."""


class UsageError(Exception):
    """A bad argument or an unsafe request (overwriting a file) found by the CLI's own checks."""
