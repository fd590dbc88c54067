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
