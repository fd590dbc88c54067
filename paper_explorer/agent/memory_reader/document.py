"""What the memory reader reads, through the sandbox's tools: its fixed actions, and the document
built back from their observations.

The reader never touches the corpus itself: every word it reads came out of ``search`` and
``read`` calls that the sandbox ran and the trajectory logs, so the tool records, detectors and
reports treat its episodes as any other. Each page a ``read`` returns is printed as one
``repr()`` line, so an observation parses back into exactly the strings the tool returned; the
document is then the papers' title and abstract and their sections, each section's pages joined
back (a paragraph the tool split across pages is joined whole again).

What is parsed is the tool's own format (``tools.layout``, whose notes and placeholders it imports:
the outline, and a page's heading, body and "... more:" line); a page that does not parse is an
error naming the paper, never text guessed at. Still text, not the host's records (issue 32 item 3
leaves this open: the reader reads whole papers in one action, past the 100,000 characters of kept
results an action's records hold, so it needs the records kept whole first).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from paper_explorer.agent.memory_reader.paging import Section
from paper_explorer.agent.policies.base import PolicyError, action
from paper_explorer.agent.prompt import EMPTY_OBSERVATION
from paper_explorer.tools.layout import CONTINUED, CONTINUES, NO_ABSTRACT
from paper_explorer.tools.layout import NO_TEXT as EMPTY_SECTION

SEARCH_HITS = 50  # search()'s most: enough hits to find K distinct papers
QUERY_CHARS = 500  # search()'s longest query
OUTLINE_SECTION = re.compile(r"^  (\d+)\. .* \(\d+ paragraphs?\)$")


@dataclass(frozen=True)
class Outline:
    paper_id: str
    title: str
    abstract: str
    sections: int


def literal(text: str) -> str:
    """``text`` as a Python string literal without a backtick: an action's code sits in a ```python
    fence, which a ``` inside the literal would close early (agent.actions.FENCED), cutting the code."""
    return repr(text).replace("`", "\\x60")


def search_action(question: str) -> str:
    """The question as a BM25 query; the hits' paper ids, best first, as the action's value."""
    query = " ".join(question.split())[:QUERY_CHARS] or "?"
    return action(f"hits = search({literal(query)}, k={SEARCH_HITS})\n[hit['paper_id'] for hit in hits]")


def top_papers(value: object, count: int) -> list[str]:
    """The first ``count`` distinct paper ids of the search's value (a list of ids)."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise PolicyError(f"the search's value is not a list of paper ids: {str(value)[:120]!r}")
    return list(dict.fromkeys(value))[:count]


def outlines_action(paper_ids: list[str]) -> str:
    listed = ", ".join(literal(paper_id) for paper_id in paper_ids)
    return action(f"for paper_id in [{listed}]:\n    print(repr(read(paper_id)))")


def paper_action(paper_id: str, sections: int) -> str:
    """Every page of every section of one paper, each printed as one repr() line. How many pages a
    section has is read from its first page's heading line, "... (page 1 of N)": the tool writes
    names on one line, so no paper text can stand in that line's place."""
    code = (
        f"for section in range({sections}):\n"
        f"    first = read({literal(paper_id)}, section=section)\n"
        "    print(repr(first))\n"
        "    pages = int(first.split('\\n', 1)[0].rsplit(' of ', 1)[1][:-1])\n"
        "    for page in range(1, pages):\n"
        f"        print(repr(read({literal(paper_id)}, section=section, page=page)))"
    )
    return action(code)


def printed_strings(observation: str, what: str) -> list[str]:
    """The strings an action printed one repr() per line (none: the loop's "no output"); an
    observation that is not that (cut, an error, a limit hit) ends the episode saying what it was."""
    if observation == EMPTY_OBSERVATION:
        return []
    strings = []
    for line in observation.split("\n"):
        try:
            value = ast.literal_eval(line)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        if not isinstance(value, str):
            tail = observation[-300:].strip()
            raise PolicyError(
                f"{what}: the observation is not the pages the read action prints (it ends {tail!r}): the action "
                "failed on this paper, or the observation was cut (--observation-chars or --output-chars below "
                "a paper's length; leave them unset)"
            )
        strings.append(value)
    return strings


def parse_outlines(observation: str, paper_ids: list[str]) -> list[Outline]:
    texts = printed_strings(observation, "the outlines")
    if len(texts) != len(paper_ids):
        raise PolicyError(f"the outlines: {len(texts)} printed for {len(paper_ids)} papers")
    return [parse_outline(text, paper_id) for text, paper_id in zip(texts, paper_ids)]


def parse_outline(text: str, paper_id: str) -> Outline:
    """The title, abstract and section count of ``read(paper_id)``'s outline. The listing is the
    last "Sections:" block (an abstract may quote one), one line per section, numbered from 0: the
    tool writes titles and names on one line."""
    head = f"{paper_id}: "
    before, marker, after = text.rpartition("\n\nSections:\n")
    listing, trailer, _ = ("\n" + after).partition("\n\nread(")  # no sections: the trailer follows at once
    if not text.startswith(head) or not marker or not trailer:
        raise PolicyError(f"paper {paper_id!r}: its outline is not in the read tool's format")
    lines = listing[1:].split("\n") if listing else []
    numbered = [OUTLINE_SECTION.match(line) for line in lines]
    if not all(match is not None and int(match.group(1)) == n for n, match in enumerate(numbered)):
        raise PolicyError(f"paper {paper_id!r}: its outline's sections are not numbered 0 to {len(lines) - 1}, one a line")
    title, _, abstract = before[len(head) :].partition("\n\n")
    return Outline(paper_id, title, "" if abstract == NO_ABSTRACT else abstract, len(lines))


def parse_paper(observation: str, outline: Outline) -> list[Section]:
    """The paper as sections of the document: its title and abstract first, then each section
    with its pages joined back."""
    pages = printed_strings(observation, f"paper {outline.paper_id!r}")
    sections = [Section(heading=outline.title, text=outline.abstract)]
    position = 0
    for number in range(outline.sections):
        name, bodies, position = _section_pages(pages, position, outline.paper_id, number)
        sections.append(Section(heading=f"{outline.title} / {name}", text=_joined(bodies)))
    if position != len(pages):
        raise PolicyError(f"paper {outline.paper_id!r}: {len(pages) - position} pages more than its sections hold")
    return sections


def _section_pages(pages: list[str], position: int, paper_id: str, number: int) -> tuple[str, list[str], int]:
    """Section ``number``'s name and page bodies, read from ``pages[position:]``; the next position."""
    prefix = f"{paper_id} / section {number}: "
    name, bodies, page = "", [], 0
    while True:
        if position >= len(pages) or not pages[position].startswith(prefix):
            raise PolicyError(f"paper {paper_id!r}: section {number} page {page + 1} is missing or not in the read tool's format")
        heading = re.compile(rf" \(page {page + 1} of (\d+)\)\n\n")
        text = pages[position][len(prefix) :]
        found = heading.search(text)
        if found is None:
            raise PolicyError(f"paper {paper_id!r}: section {number} page {page + 1} has no heading")
        name, body = text[: found.start()], text[found.end() :]
        more = f"\n\n... more: read({paper_id!r}, section={number}, page={page + 1})"
        last = page + 1 == int(found.group(1))
        if not last:
            body = body.removesuffix(more)
        bodies.append("" if body == EMPTY_SECTION else body)
        position += 1
        if last:
            return name, bodies, position
        page += 1


def _joined(bodies: list[str]) -> str:
    """A section's page bodies as one text: a paragraph the tool split across pages is whole again."""
    text = ""
    for body in bodies:
        if text.endswith(CONTINUES) and body.startswith(CONTINUED):
            text = text.removesuffix(CONTINUES) + body.removeprefix(CONTINUED)
        else:
            text = f"{text}\n\n{body}" if text else body
    return text
