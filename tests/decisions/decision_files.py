"""Typed decision files for the tests: every kind, labels, a negation pair, ordered options."""

from __future__ import annotations

import json
from pathlib import Path

DOCUMENTS = [
    {
        "id": "d1",
        "text": "The package is released under the MIT licence. Its documentation covers every public function with examples.",
        "questions": [
            {"id": "q1", "kind": "noul", "text": "Is the code open source?", "label": "yes"},
            {"id": "q1n", "kind": "noul", "text": "Is the code closed source?", "label": "no", "negation_of": "q1"},
            {
                "id": "q2",
                "kind": "choice",
                "text": "Which licence?",
                "options": ["MIT", "BSD-3-Clause", "GPL-3.0 or later"],
                "label": "MIT",
            },
            {
                "id": "q3",
                "kind": "score",
                "text": "How complete is the documentation?",
                "options": [str(n) for n in range(1, 11)],
                "label": "9",
            },
        ],
    },
    {
        "id": "d2",
        "paragraphs": ["We measure the speed of the parser.", "It parses a megabyte in a second."],
        "questions": [
            {"id": "q4", "kind": "noul", "text": "Does it report memory use?", "label": "unknown"},
            {
                "id": "q5",
                "kind": "choice",
                "text": "How severe is the slowdown?",
                "options": ["minor", "major", "critical"],
                "ordered": True,
                "label": "minor",
            },
            {"id": "q6", "kind": "score", "text": "How fast is it?", "options": ["1", "2", "3", "4", "5"]},
        ],
    },
]


def write_decisions(path: Path, documents: list[dict] | None = None) -> Path:
    path.write_text("".join(json.dumps(document) + "\n" for document in documents or DOCUMENTS), encoding="utf-8")
    return path


COLOURS = ["red", "green", "blue"]
LEVELS = [str(n) for n in range(1, 6)]


def labelled_documents(name: str, count: int) -> list[dict]:
    """``count`` documents named ``name``-i, each with a labelled question of every kind, labels
    cycling through the options: enough rows that each kind holds right and wrong answers (a
    validation file and a test file are two names)."""
    documents = []
    for i in range(count):
        colour = COLOURS[i % len(COLOURS)]
        documents.append(
            {
                "id": f"{name}-{i}",
                "text": f"Report {name} {i}. The widget is painted {colour}. Its build takes {i + 2} minutes on a laptop.",
                "questions": [
                    {
                        "id": f"{name}-{i}-open",
                        "kind": "noul",
                        "text": f"Is widget {i} painted {colour}?",
                        "label": ["yes", "no", "unknown"][i % 3],
                    },
                    {
                        "id": f"{name}-{i}-colour",
                        "kind": "choice",
                        "text": "Which colour is the widget?",
                        "options": COLOURS,
                        "label": colour,
                    },
                    {
                        "id": f"{name}-{i}-speed",
                        "kind": "score",
                        "text": "How fast is the build?",
                        "options": LEVELS,
                        "label": LEVELS[i % 5],
                    },
                ],
            }
        )
    return documents
