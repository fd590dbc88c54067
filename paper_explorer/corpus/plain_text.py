"""Papers from plain text or Markdown files (a PDF's extracted text, a paper.md): one paper per file.

The rules, kept few so a researcher can predict them (``explorer corpus from-text``):

* the paper's id is the file's name without its suffix; ids must differ;
* a heading is a Markdown ``#`` line, or a line underlined with ``===`` or ``---``; each heading
  starts a section named after it (levels are not kept: QASPER's sections are flat);
* the title is a YAML front matter ``title:``, else the first heading when nothing precedes it,
  else the file's name; text before the first section's heading is a section without a name;
* a section named "Abstract" becomes the paper's abstract (as in QASPER, not a section);
* blank lines separate paragraphs; the lines of a paragraph are joined with one space (so a PDF's
  hard-wrapped lines become one paragraph); a fenced code block is one paragraph, lines kept.

Nothing else is changed: hyphenation, citations and markup stay as the file has them, because
evidence must quote paragraphs exactly as the corpus holds them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import ValidationError

import paper_explorer.corpus.files as files
from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.errors import CorpusError, from_validation_error
from paper_explorer.corpus.loading import from_parts
from paper_explorer.corpus.schema import Paper, Section

SUFFIXES = (".txt", ".md", ".markdown")
ATX = re.compile(r"^ {0,3}#{1,6}[ \t]+(?P<text>.*?)[ \t]*#*[ \t]*$")
UNDERLINE = re.compile(r"^ {0,3}(?:={3,}|-{3,})[ \t]*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
FRONT_TITLE = re.compile(r"""^title:[ \t]*(?P<quote>["']?)(?P<title>.*?)(?P=quote)[ \t]*$""")


def text_files(paths: Iterable[str | Path]) -> list[tuple[Path, Path | None]]:
    """(file, the directory it was found in or None when named itself): the files named, and a
    directory's .txt/.md/.markdown files in name order (``corpus.files.files_in``: a FIFO, a device
    or a link out of the directory under such a name is refused, not passed over)."""
    found: list[tuple[Path, Path | None]] = []
    for path in map(Path, paths):
        if path.is_dir():
            try:
                listed = files.files_in(path, SUFFIXES, what="text")
            except files.FileRefused as error:
                raise CorpusError(str(error)) from None
            if not listed:
                raise CorpusError(f"{path}: directory holds no {', '.join(SUFFIXES)} files; name the papers' text files")
            found.extend((file, path) for file in listed)
        elif path.exists():
            found.append((path, None))  # named itself: a FIFO or device is refused when it is read
        else:
            raise CorpusError(f"{path}: no such file or directory; name text files or a directory of them")
    if not found:
        raise CorpusError("no text files named; give files or a directory of .txt/.md files")
    return found


def papers_from_text(paths: Iterable[str | Path]) -> Corpus:
    """A corpus of bare papers (no questions, no split), one per file, checked as a loaded file is."""
    found = text_files(paths)
    seen: dict[str, Path] = {}
    papers = []
    for file, inside in found:
        paper = paper_from_text(file.stem, _read(file, inside), file)
        if paper.id in seen:
            raise CorpusError(f"{file}: paper id {paper.id!r} is also {seen[paper.id]}'s (ids are file names); rename one")
        seen[paper.id] = file
        papers.append(paper)
    corpus = from_parts(papers, [], source="text files")
    return Corpus(papers=corpus.papers, sources=tuple(str(file) for file, _ in found))


def _read(file: Path, inside: Path | None) -> str:
    """The file's text (``corpus.files``: a regular file, bounded, UTF-8 without NUL), newlines made ``\\n``."""
    try:
        text = files.read_text(file, limit=files.TEXT_BYTES, inside=inside, what="text")
    except FileNotFoundError:
        raise CorpusError(f"{file}: no such file; name text files or a directory of them") from None
    except files.FileRefused as error:
        raise CorpusError(str(error)) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def paper_from_text(paper_id: str, text: str, file: Path | str = "<text>") -> Paper:
    """One paper from one file's text (the rules in this module's docstring); a paper the schema
    refuses (an id with a control character, from the file's name) is one CorpusError line."""
    try:
        return _paper(paper_id, text, file)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        if tuple(first["loc"]) == ("id",):
            reason = first["msg"].removeprefix("Value error, ")
            raise CorpusError(f"{file}: the file's name gives the paper's id, and {reason}; rename the file") from None
        raise from_validation_error(error, str(file)) from None


def _paper(paper_id: str, text: str, file: Path | str) -> Paper:
    if not paper_id:
        raise CorpusError(f"{file}: a file name gives the paper's id; this one gives none")
    lines = text.split("\n")
    title, lines = _front_matter_title(lines)
    blocks = list(_blocks(lines))
    if title is None and blocks and blocks[0][0] == "heading":
        title = blocks.pop(0)[1]
    abstract: list[str] = []
    sections: list[Section] = []
    for name, paragraphs in _grouped(blocks):
        if name is not None and name.strip().rstrip(":").lower() == "abstract" and not abstract:
            abstract = paragraphs
        else:
            sections.append(Section(name=name, paragraphs=tuple(paragraphs)))
    if not any(section.paragraphs for section in sections) and not abstract:
        raise CorpusError(f"{file}: holds no paragraphs of text; is it the paper's text?")
    return Paper(id=paper_id, title=title or paper_id, abstract="\n".join(abstract), sections=tuple(sections))


def _grouped(blocks: list[tuple[str, str]]) -> list[tuple[str | None, list[str]]]:
    """(section name, its paragraphs): a heading starts a section; text before any heading is
    a section without a name (dropped if there is none)."""
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    for kind, content in blocks:
        if kind == "heading":
            sections.append((content, []))
        else:
            sections[-1][1].append(content)
    return sections if sections[0][1] else sections[1:]


def _front_matter_title(lines: list[str]) -> tuple[str | None, list[str]]:
    """A YAML front matter block (``---`` ... ``---``) is not text; its ``title:`` is the title."""
    if not lines or lines[0].strip() != "---":
        return None, lines
    for end in range(1, len(lines)):
        if lines[end].strip() in ("---", "..."):
            titles = [found.group("title") for line in lines[1:end] if (found := FRONT_TITLE.match(line))]
            return (titles[0] or None) if titles else None, lines[end + 1 :]
    return None, lines  # no closing line: not front matter


def _blocks(lines: list[str]) -> Iterator[tuple[str, str]]:
    """("heading", text) and ("paragraph", text) in file order."""
    buffer: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if FENCE.match(line):
            yield from _flush(buffer)
            code = [line]
            while index < len(lines):
                code.append(lines[index])
                index += 1
                if FENCE.match(code[-1]):
                    break
            yield "paragraph", "\n".join(code).rstrip()
        elif not line.strip():
            yield from _flush(buffer)
        elif (heading := ATX.match(line)) is not None:
            yield from _flush(buffer)
            if heading.group("text"):
                yield "heading", heading.group("text")
        elif UNDERLINE.match(line) and len(buffer) == 1:
            yield "heading", buffer.pop().strip()
        elif UNDERLINE.match(line):
            yield from _flush(buffer)  # a rule between paragraphs, not an underline
        else:
            buffer.append(line)
    yield from _flush(buffer)


def _flush(buffer: list[str]) -> Iterator[tuple[str, str]]:
    if buffer:
        yield "paragraph", " ".join(line.strip() for line in buffer)
        buffer.clear()
