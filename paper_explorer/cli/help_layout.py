"""How generated flags are laid out in --help: the panel of each flag, the panels' order, and a
switch shown without a type placeholder. ``cli.flags`` makes the flags; this module only places them."""

from __future__ import annotations

import inspect
from typing import Any

import typer
from pydantic import BaseModel

from paper_explorer.agent.config import EvalConfig
from paper_explorer.agent.trajectory import EpisodeBudgets, EpisodeConfig
from paper_explorer.sft.config import BuildConfig
from paper_explorer.tools.limits import SandboxSettings

# Help panels: a field's own, else the panel of the model that declares it, else the command's.
FIELD_PANELS: dict[str, str] = {
    "policy.temperature": "Sampling",
    "policy.top_p": "Sampling",
    "policy.top_k": "Sampling",
    "episode.record_prompt_ids": "Output",  # what the trajectory keeps (and --no-record-prompt-ids fits 80 columns alone)
    "episode.record_sampled": "Output",
    # explorer train (sft.config.TrainConfig; its other fields are in the "Training" panel)
    "model": "Model",
    "quantization": "Model",
    "lora_r": "LoRA",
    "lora_alpha": "LoRA",
    "lora_dropout": "LoRA",
    "target_modules": "LoRA",
    "eval_steps": "Checkpoints",
    "save_steps": "Checkpoints",
    "report_to": "Checkpoints",
    "validation_examples": "Checkpoints",
    "validation_episodes": "Checkpoints",
    "validation_max_steps": "Checkpoints",
    "validation_max_new_tokens": "Checkpoints",
    "max_direct_submit_rate": "Checkpoints",
    "selection_metric": "Checkpoints",
    # explorer preregister (evaluation.preregister.PreregisterConfig)
    "min_correct_abstentions": "Pass rule",
    "max_false_abstentions": "Pass rule",
    "comparison": "Comparison",
    "alpha": "Comparison",
}
MODEL_PANELS: dict[type[BaseModel], str] = {
    EpisodeBudgets: "Episode",
    EpisodeConfig: "Episode",
    SandboxSettings: "Sandbox limits",
    EvalConfig: "Run",
    BuildConfig: "Dataset",
}
# The order panels are shown in; a panel not named here follows them.
PANEL_ORDER = (
    "Run",
    "Policy",
    "Sampling",
    "Memory reader",
    "Episode",
    "Sandbox limits",
    "Output",
    "Model",
    "LoRA",
    "Training",
    "Checkpoints",
    "Dataset",
    "Checks",
    "Pass rule",
    "Comparison",
)


def _switches_show_no_placeholder() -> None:
    """typer's help prints a type placeholder beside every option, ``<bool>`` beside a switch too
    (--help, --resume, --force), which takes no value. A switch shows none, as the generated flags'
    empty metavar already does; every other option keeps typer's own."""
    shown = typer.core.TyperOption.display_type_rich
    if getattr(shown, "switch_aware", False):  # once, however often this module is imported afresh
        return

    def display_type_rich(self: typer.core.TyperOption, ctx: Any) -> str | None:  # named as the method it replaces
        return None if self.is_bool_flag and self.metavar is None else shown(self, ctx)

    display_type_rich.switch_aware = True  # type: ignore[attr-defined]
    typer.core.TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_switches_show_no_placeholder()


def panel_rank(parameter: inspect.Parameter) -> int:
    """Typer's own panel (Options, Arguments) first, then PANEL_ORDER, then any other."""
    panel = getattr(parameter.default, "rich_help_panel", None)
    if panel is None or panel == "Options":
        return 0
    return 1 + (PANEL_ORDER.index(panel) if panel in PANEL_ORDER else len(PANEL_ORDER))
