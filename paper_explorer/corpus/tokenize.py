"""The one tokenizer used to index paragraphs and to parse queries.

``tokenize(text)``: lower-case the text, split it into runs of letters and digits (punctuation
and underscores separate tokens, so "BERT-base" -> ["bert", "base"]), keep decimal numbers
whole ("92.3" and "1,000" stay one token, because numbers are the facts papers report), and
drop English stop words unless ``stopwords=False``. No stemming: a researcher searching for
"transformers" gets paragraphs that say "transformers".
"""

from __future__ import annotations

import re
from itertools import filterfalse

TOKEN_PATTERN = re.compile(r"\d+(?:[.,]\d+)+|[^\W_]+")

STOP_WORDS = frozenset(
    """
    a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing down during each either else
    few for from further had has have having he her here hers herself him himself his how i if
    in into is it its itself just may me might more most must my myself no nor not of off on
    once only or other ought our ours ourselves out over own same shall she should so some such
    than that the their theirs them themselves then there these they this those through thus to
    too under until up upon us very was we were what when where which while who whom whose why
    will with within without would yet you your yours yourself yourselves
    """.split()
)


def tokenize(text: str, stopwords: bool = True) -> list[str]:
    """Index/query tokens of ``text``; see the module docstring for the rules."""
    tokens = TOKEN_PATTERN.findall(text.lower())
    if stopwords:
        return list(filterfalse(STOP_WORDS.__contains__, tokens))
    return tokens
