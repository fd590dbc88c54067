"""The ``explorer`` command line: the only layer that knows about flags, exit codes and terminals.

Imports flow one way - corpus <- tools <- agent <- evaluation <- sft <- cli - and nothing below
this package imports it (``tests/test_architecture.py`` walks every import to make sure).
"""
