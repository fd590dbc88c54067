"""Reading back the layout of schemas 4 to 6, which recorded no ``Shown``: what a research call
showed, parsed from its text in the exact form the host's tools wrote then. Only old trajectories
come here (``evaluation.detectors``); schema 8 is read from its records (``tools.layout``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from paper_explorer.tools.layout import CONTINUED, CONTINUES, HIT_TEXTS, NO_ABSTRACT, NO_TEXT, UNTITLED, is_hit, whole_items


@dataclass(frozen=True)
class LegacyShown:
    """What one result of a schema 4 to 6 trajectory showed, as its text reads in the old form."""

    texts: list[str]
    places: set[tuple[str, int, int]]


def legacy_shown(name: str, arguments: dict, text: str, cut: bool) -> LegacyShown | None:
    """The old rule, for schemas 4 to 6 (which kept no ``Shown`` record): what one research call's
    kept result showed, parsed from its text; None when it is not in the form the host's tools
    wrote then (the read page and outline above, the hits' JSON). Paper text that imitates that
    form (a blank line and "[4] " inside a paragraph) misleads it, which is why schema 7 on records
    what was shown instead."""
    if name == "read":
        paper_id = arguments.get("paper_id")
        if not isinstance(paper_id, str):
            return None
        if cut:  # a page is ~2,500 characters, far below the cap: never cut in practice
            return LegacyShown([], set())
        if arguments.get("section") is None:
            return _legacy_outline(paper_id, text)
        return _legacy_page(paper_id, text)
    if name not in HIT_TEXTS:
        return None
    return _legacy_hits(name, text, cut)


_PAGE_HEADING = re.compile(r"(?P<section>[0-9]+): (?P<name>.*) \(page (?P<page>[0-9]+) of (?P<pages>[0-9]+)\)")
_PARAGRAPH_MARKER = re.compile(r"\[(?P<paragraph>[0-9]+)\] ")
_OUTLINE_SECTION = re.compile(r"  (?P<number>[0-9]+)\. (?P<name>.*) \((?P<count>[0-9]+) paragraphs?\)")


def _legacy_page(paper_id: str, text: str) -> LegacyShown | None:
    heading, _, body = text.partition("\n\n")
    prefix = f"{paper_id} / section "
    match = _PAGE_HEADING.fullmatch(heading[len(prefix) :]) if heading.startswith(prefix) else None
    if match is None:
        return None
    section, page, page_count = int(match["section"]), int(match["page"]), int(match["pages"])
    more = f"\n\n... more: read({paper_id!r}, section={section}, page={page})"
    if page < page_count:
        if not body.endswith(more):
            return None
        body = body[: -len(more)]
    texts = [match["name"]] if match["name"] != UNTITLED else []
    if body == NO_TEXT:
        return LegacyShown(texts, set())
    found: list[list] = []
    for chunk in body.split("\n\n"):
        marker = _PARAGRAPH_MARKER.match(chunk)
        if marker is not None:
            found.append([int(marker["paragraph"]), chunk[marker.end() :]])
        elif chunk.startswith(CONTINUED) and not found:  # only a page's first piece continues one
            found.append([None, chunk[len(CONTINUED) :]])
        elif found:  # a blank line inside a paragraph
            found[-1][1] += "\n\n" + chunk
        else:
            return None
    texts += [piece.removesuffix(CONTINUES) for _, piece in found]
    return LegacyShown(texts, {(paper_id, section, paragraph) for paragraph, _ in found if paragraph is not None})


def _legacy_outline(paper_id: str, text: str) -> LegacyShown | None:
    head, tail = f"{paper_id}: ", f"\n\nread({paper_id!r}, section=N) shows a section's paragraphs."
    if not (text.startswith(head) and text.endswith(tail)):
        return None
    front, found, listing = text[len(head) : -len(tail)].rpartition("\n\nSections:")
    lines = listing.split("\n")
    if not found or lines[0]:
        return None
    title, _, abstract = front.partition("\n\n")
    texts = [title] + ([abstract] if abstract != NO_ABSTRACT else [])
    for number, line in enumerate(lines[1:]):
        match = _OUTLINE_SECTION.fullmatch(line)
        if match is None or int(match["number"]) != number:
            return None
        texts += [match["name"]] if match["name"] != UNTITLED else []
    return LegacyShown(texts, set())


def _legacy_hits(name: str, text: str, cut: bool) -> LegacyShown | None:
    """A JSON list of hits, each naming the paragraph it comes from; of one cut at its cap, the hits kept whole."""
    try:
        found = whole_items(text) if cut else json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, list) or not all(is_hit(name, hit) for hit in found):
        return None
    return LegacyShown(
        [hit[field] for hit in found for field in HIT_TEXTS[name]], {(hit["paper_id"], hit["section"], hit["paragraph"]) for hit in found}
    )
