"""paper-explorer as a library: what the ``explorer`` commands do, as calls.

```python
from paper_explorer import EvalConfig, Run, evaluate

result = evaluate(EvalConfig(policy={"name": "scripted"}, limit=5), out="runs/api")
result.metrics.answer_f1            # what `explorer inspect runs/api` shows
frame = Run.load("runs/api").to_pandas()  # one row per scored episode
```

Errors name the Python argument to change (``pass resume=True``), not the command's flag.

Each name is imported on first use (PEP 562), so ``import paper_explorer`` stays fast and
training's heavy imports (torch, transformers) wait for ``train``. The commands are thin layers
over these calls: parse the flags into the config, make one call, print.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS = {
    "EvalConfig": "paper_explorer.agent.config",
    "RunConfig": "paper_explorer.agent.config",
    "PolicyConfig": "paper_explorer.agent.config",
    "EpisodeConfig": "paper_explorer.agent.trajectory",
    "Corpus": "paper_explorer.corpus",
    "load_corpus": "paper_explorer.evaluation.run",
    "evaluate": "paper_explorer.evaluation.run",
    "run": "paper_explorer.evaluation.episode",
    "Episode": "paper_explorer.evaluation.episode",
    "PreregisterConfig": "paper_explorer.evaluation.preregister",
    "preregister": "paper_explorer.evaluation.preregister",
    "compare": "paper_explorer.evaluation.run_comparison",
    "report": "paper_explorer.evaluation.html_report",
    "Run": "paper_explorer.evaluation.run_directory",
    "BuildConfig": "paper_explorer.sft.config",
    "TrainConfig": "paper_explorer.sft.config",
    "build_dataset": "paper_explorer.sft.build",
    "train": "paper_explorer.sft.train",
    "ImproveSettings": "paper_explorer.sft.config",
    "improve": "paper_explorer.sft.improve",
    "TeachConfig": "paper_explorer.sft.teach",
    "teach": "paper_explorer.sft.teach",
    "decide": "paper_explorer.decisions.api",
    "DecisionRun": "paper_explorer.decisions.run_reading",
}

__all__ = [  # what _EXPORTS holds (a test checks they agree), spelled out for readers and linters
    "BuildConfig",
    "Corpus",
    "DecisionRun",
    "Episode",
    "EpisodeConfig",
    "EvalConfig",
    "ImproveSettings",
    "PolicyConfig",
    "PreregisterConfig",
    "Run",
    "RunConfig",
    "TeachConfig",
    "TrainConfig",
    "build_dataset",
    "compare",
    "decide",
    "evaluate",
    "improve",
    "load_corpus",
    "preregister",
    "report",
    "run",
    "teach",
    "train",
]

if TYPE_CHECKING:
    from paper_explorer.agent.config import EvalConfig, PolicyConfig, RunConfig
    from paper_explorer.agent.trajectory import EpisodeConfig
    from paper_explorer.corpus import Corpus
    from paper_explorer.decisions.api import decide
    from paper_explorer.decisions.run_reading import DecisionRun
    from paper_explorer.evaluation.episode import Episode, run
    from paper_explorer.evaluation.html_report import report
    from paper_explorer.evaluation.preregister import PreregisterConfig, preregister
    from paper_explorer.evaluation.run import evaluate, load_corpus
    from paper_explorer.evaluation.run_comparison import compare
    from paper_explorer.evaluation.run_directory import Run
    from paper_explorer.sft.build import build_dataset
    from paper_explorer.sft.config import BuildConfig, ImproveSettings, TrainConfig
    from paper_explorer.sft.improve import improve
    from paper_explorer.sft.teach import TeachConfig, teach
    from paper_explorer.sft.train import train


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'paper_explorer' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
