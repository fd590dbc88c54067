"""A tool failure the policy can act on: shown to it as an observation, never a traceback."""


class ToolError(Exception):
    """Bad arguments, an unknown paper or section, an ended episode: the message says what to do."""
