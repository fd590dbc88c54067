"""A careful reader's rules of thumb: which sentence answers a question, which span of it, and
when the evidence does not answer it at all. Shared by the scripted baselines.

Nothing here knows how the demo corpus was generated; the rules are about questions in general:
an answer must match the question's type (a number for "how many", a duration for "how long",
yes or no for a polar question), and every name the question mentions must be in the evidence.

Why one module: it is one procedure, ``decide``, with the span readers it calls (names,
improvements, comparisons, counts) and the question parse they all share (its type, names and
stems); split, each part would only pass that parse to the next.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from paper_explorer.corpus.tokenize import STOP_WORDS, tokenize

POLAR_STARTS = {"is", "are", "was", "were", "does", "do", "did", "can", "could", "has", "have", "had", "will", "should"}
QUANTITY_WORDS = {"rate", "size", "number", "count", "percentage", "score", "reach", "reaches", "obtain", "achieve"}
DURATION_UNITS = {"second", "seconds", "minute", "minutes", "hour", "hours", "day", "days", "week", "weeks", "month", "months"}
NEGATIONS = {"not", "no", "never", "without", "cannot", "neither", "nor"}
EXCLUSIVE_CUES = {"only", "solely", "exclusively"}
LOWER_IS_BETTER = {"perplexity", "wer", "cer", "ter", "error", "loss", "mae", "rmse", "mse", "latency"}
BOUNDARIES = {"for", "with", "which", "that", "because", "while", "compared", "whereas", "since", "but", "after", "before"}
TRIM = {
    "a",
    "an",
    "the",
    "of",
    "on",
    "in",
    "at",
    "to",
    "by",
    "as",
    "is",
    "are",
    "was",
    "were",
    "be",
    "has",
    "have",
    "uses",
    "use",
    "used",
    "obtains",
    "reaches",
    "achieves",
    "against",
    "about",
    "around",
    "approximately",
    "and",
    "it",
    "its",
    "we",
    "our",
    "this",
    "these",
    "that",
    "there",
    "total",
}
TOKEN = re.compile(r"\S+")
NUMBER = re.compile(r"\d")
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
DATE = re.compile(rf"(?:\d{{1,2}} )?(?:(?:{MONTHS}) )?(?:\d{{1,2}}, )?\b(?:1[89]|20)\d\d\b")
NUMBER_WORDS = {
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "dozens",
    "hundreds",
    "thousands",
}

# Markup that real papers carry and a reader skips: citations, cross-references, footnotes, links, code
# and emphasis marks. Each pattern keeps the words a reader would read aloud.
MARKUP = (
    (re.compile(r"\[[^\[\]]*@[^\[\]]*\]"), ""),  # [@key; @key2], [e.g., @key]
    (re.compile(r"(?<![\w.])-?@[\w:.\-]*\w"), ""),  # @key in running text
    (re.compile(r"\\(?:auto)?ref\{[^}]*\}|\[\^[^\]]*\]"), ""),  # \autoref{fig:x}, [^1]
    (re.compile(r"\[([^\[\]]+)\]\([^)\s]*\)"), r"\1"),  # [text](url) -> text
    (re.compile(r"<?https?://\S+?>?(?=[\s,;)]|\.(?:\s|$)|$)"), ""),  # bare links
    (re.compile(r"[`*]+|(?<!\w)_+|_+(?!\w)"), ""),  # `code`, *emphasis*, _emphasis_
    (re.compile(r"\(\s*[,;]?\s*\)"), ""),  # brackets left empty
    (re.compile(r"\s+([,.;:)])"), r"\1"),
    (re.compile(r"\s{2,}"), " "),
)
CODE = re.compile(r"`([^`]+)`")  # emphasis marks ordinary words as often as names, so only code counts


def clean(text: str) -> str:
    """``text`` without the markup a reader skips (citations, links, code marks), as it reads aloud."""
    for pattern, replacement in MARKUP:
        text = pattern.sub(replacement, text)
    return text.strip()


def marked_words(text: str) -> set[str]:
    """Words set in code (`spacy`, `geopandas`): names even when written in lower case."""
    return {word.lower() for part in CODE.findall(text) for word in part.split()}


def stem(word: str) -> str:
    """A crude suffix stripper: "trained", "training" and "train" meet, as do "compare" and "compared"."""
    word = word.lower().strip(".,;:()[]\"'")
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            word = word[: -len(suffix)]
            if suffix in ("ing", "ed") and len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]  # "plotting" and "plots" meet; "installed" and "install" still do
            break
    return word[:-1] if len(word) > 4 and word.endswith("e") else word


def question_stems(question: str) -> set[str]:
    return {stem(token) for token in tokenize(question)}


def names_in(question: str) -> list[str]:
    """Names the evidence must contain: words with a capital or a digit, except the first word."""
    words = [word.strip("?.,;:()\"'") for word in question.split()[1:]]
    return [word for word in words if word and (any(c.isupper() for c in word) or NUMBER.search(word))]


def is_polar(question: str) -> bool:
    first = question.split()[0].lower() if question.split() else ""
    return first in POLAR_STARTS


def answer_type(question: str) -> str:
    """ "polar", "duration", "count" (how many X), "quantity" or "entity"."""
    lowered = question.lower()
    if is_polar(question):
        return "polar"
    if lowered.startswith("how long"):
        return "duration"
    if lowered.startswith(("when ", "in what year", "in which year")):
        return "date"
    if lowered.startswith("how many"):
        return "count"
    if lowered.startswith("how much") and re.search(r"\bimprove|\bgain|\bbetter", lowered):
        return "improvement"
    words = set(re.findall(r"[a-z]+", lowered))
    if lowered.startswith("how much") or words & QUANTITY_WORDS:
        return "quantity"
    return "entity"


def mentions_all(sentence: str, names: list[str]) -> bool:
    lowered = sentence.lower()
    return all(name.lower() in lowered for name in names)


@dataclass(frozen=True)
class Decision:
    answer: str | None  # None: abstain
    sentence: str | None
    reason: str


def decide(question: str, sentences: list[str], known: str = "") -> Decision:
    """The answer a careful reader gives from ``sentences`` (best first), or an abstention and why.

    ``known`` is text already established as relevant (the title of the paper being read): a
    name it contains need not be repeated by every sentence, and the name it opens with (before
    a colon) is what the paper is about, so mentioning it is no evidence of an answer.
    The returned ``sentence`` is one of ``sentences`` as given; the rules read them without markup.
    """
    original = {clean(s): s for s in reversed(sentences)}  # the first of two that read alike wins
    codes = {word for s in sentences for word in marked_words(s)}
    sentences = [clean(s) for s in sentences]
    names = [name for name in names_in(question) if name.lower() not in known.lower()]
    kind = answer_type(question)
    usable = [s for s in sentences if mentions_all(s, names)]
    if not usable:
        missing = [n for n in names if not any(n.lower() in s.lower() for s in sentences)]
        return Decision(None, None, f"no sentence mentions {', '.join(missing) or ' and '.join(names)}")
    stems = question_stems(question)
    subject = {stem(token) for token in tokenize(known.split(":")[0])} if ":" in known else set()
    topic = stems - {stem(n) for n in names_in(question)} - subject

    all_names = names_in(question)

    def relevance(sentence: str) -> int:
        """Question terms the sentence shares, plus the names it mentions (even ones the title covers)."""
        return len({stem(token) for token in TOKEN.findall(sentence)} & topic) + sum(name.lower() in sentence.lower() for name in all_names)

    ranked = sorted(usable, key=relevance, reverse=True)  # stable: extraction order breaks ties
    if kind == "polar":
        return Decision(polar_answer(question, ranked[0]), original[ranked[0]], "a polar question answered by the evidence")
    if kind == "improvement":
        for sentence in ranked:
            answer = improvement(question, sentence)
            if answer:
                return Decision(answer, original[sentence], "the gain over the strongest baseline, computed from the reported scores")
    head = _head(question)
    for sentence in ranked:
        said = {stem(token) for token in TOKEN.findall(sentence)}
        if not said & topic:
            continue
        if kind == "entity" and head and head not in said and not _covers(said, topic - {head}):
            continue  # neither the thing asked for ("license", "platform") nor most of the question is here
        span = None
        if kind == "entity":
            span = name_span(question, sentence, topic, known, codes)
        span = span or best_span(question, sentence, kind, stems)
        if span:
            return Decision(span, original[sentence], f"a {kind} found next to the question's terms")
    wanted = {
        "count": "a number",
        "quantity": "a number",
        "duration": "a duration",
        "date": "a date",
        "entity": "an answer",
        "improvement": "comparable scores",
    }[kind]
    return Decision(None, None, f"the relevant sentences do not state {wanted} for this question")


JOINERS = {",", "and", "or", "&"}
INNER = {"of", "for", "de"}  # "University of Lille", "Department of Energy": one name across a small word


def _name_like(word: str, first: bool, codes: set[str]) -> bool:
    """A word that names something: a capital or a digit inside it, a capital not at the sentence's
    start, or set in code. Capitalised stop words ("The", "In") never are."""
    bare = word.strip(",.;:()[]\"'")
    if not bare or bare.lower() in STOP_WORDS:
        return False
    if bare.lower() in codes or NUMBER.search(bare) or any(c.isupper() for c in bare[1:]):
        return True
    return bare[0].isupper() and not first


def name_span(question: str, sentence: str, topic: set[str], known: str, codes: set[str]) -> str | None:
    """The name (or list of names) nearest the question's terms in ``sentence``, none of them the
    question's own names or the paper's: "SQLite" in "Melodie uses an SQLite database" for "Which
    database does Melodie use?". Nearest wins; a name right next to the word the question asks
    for ("database", "license", "framework") wins over one further away."""
    tokens = TOKEN.findall(sentence)
    said = f"{question} {known.split(':')[0]}"
    asked = {stem(token) for token in tokenize(said)} | {stem(word) for word in said.split()}
    focus = _focus(question)
    anchors = [i for i, token in enumerate(tokens) if stem(token) in topic]
    if not anchors:
        return None
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(tokens):
        if _name_like(tokens[i], i == 0, codes) and stem(tokens[i]) not in asked:
            j = i
            while j + 1 < len(tokens) and not tokens[j].endswith((".", ";", ":", ")")):
                step = j + 1
                if tokens[j].endswith(",") or tokens[step].lower() in JOINERS:  # a list goes on after a comma or "and"
                    if tokens[step].lower() in JOINERS:
                        step += 1
                    if step < len(tokens) and _name_like(tokens[step], False, codes) and stem(tokens[step]) not in asked:
                        j = step
                        continue
                    break
                if _name_like(tokens[step], False, codes) and stem(tokens[step]) not in asked:
                    j = step
                    continue
                if (
                    tokens[step] in INNER
                    and step + 1 < len(tokens)
                    and tokens[step + 1][:1].isupper()
                    and _name_like(tokens[step + 1], False, codes)
                    and stem(tokens[step + 1]) not in asked
                ):
                    j = step + 1
                    continue
                break
            spans.append((i, j))
            i = j + 1
        else:
            i += 1
    if not spans:
        return None

    def score(span: tuple[int, int]) -> float:
        start, end = span
        distance = min(min(abs(a - start), abs(a - end)) for a in anchors)
        beside_focus = focus is not None and any(stem(tokens[k]) == focus for k in (start - 1, end + 1, end + 2) if 0 <= k < len(tokens))
        return -distance + 2.0 * beside_focus

    start, end = max(spans, key=score)  # max keeps the first of equals: the earlier name
    return " ".join(tokens[start : end + 1]).strip(",.;:()[]\"' ")


SCORE_PAIR = re.compile(
    r"([A-Z][\w\-.+/]*(?: [A-Z0-9][\w\-.+/]*)*) (?:obtains |reaches |achieves |gets )?(-?\d+(?:\.\d+)?)(?: ([\w\-@]+))?"
)


def improvement(question: str, sentence: str) -> str | None:
    """ "How much does A improve over the strongest baseline": A's score minus the best other score."""
    names = names_in(question)
    if not names:
        return None
    subject = names[0]
    scores: dict[str, float] = {}
    unit = None
    for name, value, word in SCORE_PAIR.findall(sentence):
        name = name.split(", ")[-1].strip()
        if name == subject and word:
            unit = word
        scores.setdefault(name, float(value))
    if subject not in scores or len(scores) < 2:
        return None
    others = {name: value for name, value in scores.items() if name != subject and not any(n == name for n in names[1:])}
    others = {name: value for name, value in others.items() if not name[0].isdigit()}
    if not others:
        return None
    lower_better = bool(set(re.findall(r"[a-z]+", sentence.lower())) & LOWER_IS_BETTER)
    best = (min if lower_better else max)(others, key=lambda name: others[name])
    gain = abs(scores[subject] - others[best])
    return f"By {gain:.1f} {unit + ' ' if unit else ''}points over {best}."


def polar_answer(question: str, sentence: str) -> str:
    words = [w.strip(".,;:()\"'").lower() for w in sentence.split()]
    lowered_q = question.lower()
    if any(cue in lowered_q for cue in ("outperform", "better than", "beat", "improve over")):
        verdict = comparison(question, sentence)
        if verdict is not None:
            return verdict
    negated = any(w in NEGATIONS or w.endswith("n't") for w in words)
    if any(cue in lowered_q for cue in ("other than", "besides", "beyond", "apart from")):
        negated = negated or any(w in EXCLUSIVE_CUES for w in words)
    return "No" if negated else "Yes"


def comparison(question: str, sentence: str) -> str | None:
    """ "Does A outperform B": compare the numbers that follow A and B in the sentence."""
    names = names_in(question)
    if len(names) < 2:
        return None
    first, second = names[0], names[1]
    a, b = _number_after(sentence, first), _number_after(sentence, second)
    if a is None or b is None:
        return None
    lower_better = bool(set(re.findall(r"[a-z]+", sentence.lower())) & LOWER_IS_BETTER)
    return "Yes" if (a < b if lower_better else a > b) else "No"


def _number_after(sentence: str, name: str) -> float | None:
    match = re.search(re.escape(name) + r"\W+(?:\w+\s+){0,2}?(-?\d+(?:\.\d+)?)", sentence)
    return float(match.group(1)) if match else None


def best_span(question: str, sentence: str, kind: str, stems: set[str]) -> str | None:
    tokens = TOKEN.findall(sentence)
    marked = [stem(token) in stems or token.strip(".,;:") in names_in(question) for token in tokens]
    if kind == "count":
        head = _count_head(question)
        for i, token in enumerate(tokens):
            if head and stem(token) == head:
                # "12 layers", and in prose "three different variants": a number up to two words before
                for before in range(i - 1, max(i - 3, -1), -1):
                    bare = tokens[before].strip(".,;:()").lower()
                    if NUMBER.search(bare) or bare in NUMBER_WORDS:
                        return tokens[before].strip(".,;:()")
        return None
    if kind == "date":
        match = DATE.search(sentence)
        return match.group(0) if match else None
    if kind == "quantity" and _focus(question):
        focus = _focus(question)
        for i, token in enumerate(tokens):
            if stem(token) == focus:
                for following in tokens[i + 1 : i + 5]:
                    if NUMBER.search(following):
                        return following.strip(".,;:()")
        return None
    candidates = []
    run: list[int] = []
    for i, token in enumerate(tokens + ["."]):
        bare = token.lower().strip(",")
        ends_run = (
            i == len(tokens) or marked[i] or bare in BOUNDARIES or (bare == "and" and i + 1 < len(tokens) and tokens[i + 1][:1].islower())
        )
        if not ends_run:
            run.append(i)
        if ends_run or token.endswith((".", ";", ":")):
            if run:
                candidates.append(run)
            run = []
    best, best_score = None, 0.0
    for run in candidates:
        words = [tokens[i] for i in run]
        while words and words[0].lower().strip(",.;:") in TRIM:
            words.pop(0)
        while words and words[-1].lower().strip(",.;:") in TRIM:
            words.pop()
        if not words:
            continue
        text = " ".join(words).strip(",.;:() ")
        has_number = bool(NUMBER.search(text))
        adjacent = run[0] > 0 and marked[run[0] - 1]
        score = 2.0 * adjacent
        if kind in ("quantity", "duration"):
            if not has_number or not adjacent and kind == "quantity":
                continue
            if kind == "duration":
                if not {w.lower().strip(",.") for w in words} & DURATION_UNITS:
                    continue
            score += 2
        else:
            score += any(w[:1].isupper() or NUMBER.search(w) for w in words)
        score -= 0.01 * len(words)
        if score > best_score:
            best, best_score = text, score
    return best


def _focus(question: str) -> str | None:
    """The first word of what a "what/which X is ..." question asks for ("batch" in "What batch size")."""
    words = question.lower().rstrip("?").split()
    if len(words) > 2 and words[0] in ("what", "which") and words[1] not in AUXILIARIES:
        return stem(words[1])
    return None


AUXILIARIES = {"is", "are", "was", "were", "does", "do", "did", "has", "have"}
VERBS = AUXILIARIES | {"can", "could", "will", "would", "should", "may", "might"}
GENERIC = {stem(word) for word in ("use", "used", "using", "provide", "provided", "support", "supported", "implement", "implemented")}


def _head(question: str) -> str | None:
    """The noun a "what/which X ... is" question asks for: the last word before its verb ("license" in
    "What license is Acme released under?", "software" in "Which tide prediction software does ...")."""
    words = [word.strip("?,'\"") for word in question.lower().split()]
    while words and words[0] in ("in", "on", "under", "for", "with", "to", "from", "by", "of", "at"):
        words = words[1:]
    if len(words) < 3 or words[0] not in ("what", "which"):
        return None
    phrase = []
    for word in words[1:]:
        if word in VERBS or word.endswith("ed"):  # "Which platform produced ...": a past-tense verb ends it too
            break
        phrase.append(word)
    return stem(phrase[-1]) if phrase and phrase[-1] not in TRIM else None


def _covers(said: set[str], terms: set[str]) -> bool:
    """At least half of the question's specific terms (generic verbs like "use" aside) are in ``said``."""
    specific = terms - GENERIC
    return bool(specific) and 2 * len(said & specific) >= len(specific)


def _count_head(question: str) -> str | None:
    """The noun a "how many" question counts: the first content word after "how many"."""
    words = question.lower().rstrip("?").split()[2:]
    for word in words:
        if word not in TRIM and word not in {"does", "do", "did"}:
            return stem(word)
    return None


def sentences(text: str) -> list[str]:
    """The tools' sentence splitter, imported when a policy reads (it brings the corpus index's numpy and scipy)."""
    from paper_explorer.tools.paper_tools import sentences as split

    return split(text)
