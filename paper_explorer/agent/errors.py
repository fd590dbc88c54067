"""The agent layer's own error: bad input it was given, reported by the CLI as one line (exit 2)."""


class AgentError(Exception):
    """A trajectory file, a policy's settings, a model or a tokenizer that cannot be used as given;
    the message says what is wrong and how to fix it."""
