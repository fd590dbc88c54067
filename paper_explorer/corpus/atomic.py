"""Files that appear whole or not at all: ``corpus.files.atomic_file``, named here too for code
that imports it from its first home."""

from paper_explorer.corpus.files import atomic_file

__all__ = ["atomic_file"]
