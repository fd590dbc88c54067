"""The ``explorer`` command line: the only layer that knows about flags, exit codes and terminals.

Imports flow one way - corpus <- tools <- agent <- evaluation <- sft <- cli - and nothing below
this package imports it (``tests/test_architecture.py`` walks every import to make sure).
"""

from paper_explorer.cli.plugins import load_plugins_named_by_the_environment

# Before any command module is imported: a policy a plugin registers gets its flags there.
load_plugins_named_by_the_environment()
