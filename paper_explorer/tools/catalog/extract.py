"""``extract(paper_id, query, k=5, regex=False)``: the sentences of one paper that best match words,
or a linear-time RE2 regex, each bounded in cost whatever the pattern."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Annotated

import re2
from pydantic import Field

from paper_explorer.corpus import tokenize
from paper_explorer.corpus.schema import PAPER_ID_CHARS
from paper_explorer.tools import layout
from paper_explorer.tools.arguments import Arguments
from paper_explorer.tools.errors import ToolError
from paper_explorer.tools.paper_tools import encodable
from paper_explorer.tools.registry import Tool

if TYPE_CHECKING:
    from paper_explorer.tools.paper_tools import PaperTools

REGEX_MEMORY = 1 << 20  # RE2's budget for one compiled pattern (its default, 8 MiB, takes seconds to fill)
# RE2 program instructions x bytes of sentences one regex extract may scan: where its DFA gives up,
# its NFA costs ~1-3 ns per instruction and byte, so this bounds a call to ~0.15 s whatever the pattern.
REGEX_WORK = 50_000_000


class ExtractArgs(Arguments):
    paper_id: Annotated[str, Field(min_length=1, max_length=PAPER_ID_CHARS, description="the paper to extract from")]
    query: Annotated[str, Field(min_length=1, max_length=500, description="words to match, or a pattern if regex=True")]
    k: Annotated[int, Field(ge=1, le=20, description="number of sentences")] = 5
    regex: Annotated[bool, Field(description="treat query as a case-insensitive RE2 regular expression")] = False


def extract(episode: PaperTools, args: ExtractArgs) -> layout.Rendered:
    paper = episode.paper(args.paper_id)
    sentence_index = episode.sentences_of(paper)
    located = sentence_index.located
    if args.regex:
        pattern = compiled(args.query)
        work = pattern.programsize * sentence_index.utf8_bytes
        if work > REGEX_WORK:
            raise ToolError(
                f"extract(): the pattern is too complex to run over {paper.id!r} ({pattern.programsize:,} RE2 "
                f"instructions x {sentence_index.utf8_bytes:,} bytes of text, over the {REGEX_WORK:,} a call "
                f"may use); use a simpler pattern, or words without regex=True"
            )
        matching = (i for i, text in enumerate(sentence_index.searchable) if pattern.search(text))
        ranked = [(i, 1.0) for i in itertools.islice(matching, args.k)]  # the first k: no need to look further
    else:
        ranked = sentence_index.bm25.top_k(tokenize(args.query), args.k)
    found = [
        {
            "paper_id": paper.id,
            "section": located[i][0],
            "section_name": paper.sections[located[i][0]].name or "",
            "paragraph": located[i][1],
            "sentence": located[i][2],
            "score": round(score, 3),
        }
        for i, score in ranked
    ]
    return layout.hits(found, "extract")


def compiled(query: str) -> re2._Regexp:
    """``query`` compiled by RE2, case-insensitive, within REGEX_MEMORY; a bad pattern is a ToolError."""
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = False
    options.max_mem = REGEX_MEMORY  # bounds compile time too: a huge program is refused, not built
    try:
        # The class, not re2.compile: that keeps the last 128 patterns in a cache of the process, which
        # would hold up to 128 x REGEX_MEMORY and tell the next episode on this host, by how fast its
        # own patterns compile, which patterns an earlier one asked for.
        return re2._Regexp(encodable(query), options)
    except re2.error as error:
        detail = error.args[0].decode() if error.args and isinstance(error.args[0], bytes) else str(error)
        hint = "make it smaller" if "too large" in detail else "RE2 has no backreferences or lookaround"
        raise ToolError(f"extract(): not a valid RE2 pattern ({detail}); {hint}") from None


TOOL = Tool(
    name="extract",
    arguments=ExtractArgs,
    function=extract,
    summary="The sentences of one paper that best match a query (or a regex), with their location.",
    returns="a list of {paper_id, section, section_name, paragraph, sentence, score}, best first",
    example='extract(hits[0]["paper_id"], "number of training examples", k=2)',
    order=30,
    record="shown",
)
