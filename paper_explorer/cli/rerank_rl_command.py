"""``explorer rl-rerank``: flags (made from ``ListwiseConfig``'s fields) -> the config ->
``rl.listwise_train.train_reranker`` -> a line per step and the validation table."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from paper_explorer.cli.flags import config_flags
from paper_explorer.cli.options import CorpusOption, SplitOfOption, split_of
from paper_explorer.rl.listwise_train import ListwiseConfig

console = Console()


@config_flags(ListwiseConfig, panel="Training")
def rl_rerank_command(
    out: Path = typer.Option(..., "--out", "-o", help="Directory for the steps, the validation and the adapter."),
    corpus_path: Path | None = CorpusOption,
    split_of_values: list[str] | None = SplitOfOption,
    config_file: Path | None = typer.Option(None, "--config", help="TOML with any of its settings (the command line wins)."),
    force: bool = typer.Option(False, "--force", help="Replace the rl-rerank run in OUT."),
    overrides: dict | None = None,  # the settings given as flags (cli.flags, from ListwiseConfig's fields)
) -> None:
    """Listwise RL of the model as a reranker of BM25 hits: Plackett-Luce rankings of P(relevant),
    an NDCG reward, a leave-one-out baseline and a KL to the starting model."""
    from paper_explorer.agent.config import load_config
    from paper_explorer.cli.options import open_corpus
    from paper_explorer.rl.listwise_train import train_reranker

    given = dict(overrides or {})
    given["corpus"] = str(corpus_path) if corpus_path else None
    config = load_config(ListwiseConfig, config_file, given)
    corpus = open_corpus(Path(config.corpus) if config.corpus else None, splits=split_of(split_of_values))
    result = train_reranker(config, corpus, out, force=force, log=typer.echo)
    table = Table(title=f"validation: {int(result['after']['questions']['count'])} questions, the same BM25 candidates")
    for column in ("order", *result["after"]["bm25"]):
        table.add_column(column, justify="left" if column == "order" else "right")
    table.add_row("BM25", *(f"{value:.3f}" for value in result["after"]["bm25"].values()))
    table.add_row("reranked, before", *(f"{value:.3f}" for value in result["before"]["reranked"].values()))
    table.add_row("reranked, after", *(f"{value:.3f}" for value in result["after"]["reranked"].values()))
    console.print(table)
    typer.echo(f"adapter written to {out / 'adapter'}")
