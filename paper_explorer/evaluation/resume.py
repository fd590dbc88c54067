"""What ``explorer eval --resume`` checks before it runs anything, and what it reads back.

A run directory is finished only by the run that started it: the same config (the manifest's,
which a resume reads back, so nothing needs repeating), the same corpus and prompt (their
hashes), and a log whose every line that run made. Each refusal is one ``EvaluationError`` that
names what differs and what to do; a directory of another kind (``run_directory.kind_of``) is
named as what it is, with the command that takes it, so that the hints for a new run ("pass
resume=True") and for a resume ("without resume=True") never point at each other. Settings are
named through ``corpus.setting_names.setting``: as the Python caller passes them, or as flags.

What may change on a resume: how episodes are run (``EXECUTION_FIELDS``: workers, concurrency, ray),
where the corpus lies (it is found again by its recorded path or given anew, and checked by
hash), and the server(s) of an ``openai`` policy, named again with ``--base-url`` (a server
moves; trajectories record which one answered each step). Not checked here: the server's weights
(a served model is named, not hashed; the preflight checks its name).

The user's key goes only to servers the user named in this invocation (``refuse_unnamed_server``):
a run directory may come from someone else, and its manifest would otherwise direct
``OPENAI_API_KEY`` to a server of its author's choosing. A recorded server is reused only when no
key would be sent (``OPENAI_API_KEY`` unset, empty or "EMPTY"); with a key, the resume is refused
until ``--base-url`` (or ``base_url`` in ``--config``) names the server again.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path
from typing import Any

from paper_explorer.agent.config import EvalConfig, build_config, dotted, load_config, read_toml
from paper_explorer.agent.manifest import RecordedEvalConfig, RunManifest, differing_settings
from paper_explorer.agent.trajectory import Hashes, Trajectory
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.run_directory import (
    EVAL_RUN,
    MANIFEST,
    RUN_FILES,
    TRAJECTORIES,
    Key,
    counted,
    episode_key,
    first_stranger,
    kind_of,
    read_log,
    read_manifest,
)

# Fields of a manifest's config that the run derived rather than was given.
DERIVED_FIELDS = ("questions", "selected_questions_sha256")
# How episodes are run, not which or how they go: a resumed run may change them.
EXECUTION_FIELDS = ("workers", "concurrency", "ray")
# Where an openai policy's requests go: a resumed run may change it, named in its own command.
SERVER_FIELD = "policy.base_url"
DEMO_SOURCE_PREFIX = "demo("  # how a generated corpus names its source (corpus.demo)


def check_out(out: Path, resume: bool) -> None:
    """``out`` can take a new run (``resume`` False) or holds the run to finish (True); refused
    early, before a corpus or a model is loaded."""
    if out == Path("."):
        raise EvaluationError(f"{setting('out')} names the run directory to write; give one other than the current directory")
    if out.exists() and not out.is_dir():
        raise EvaluationError(f"{out}: is a file; {setting('out')} names a run directory")
    for name in RUN_FILES:
        _check_run_file(out / name)
    kind = kind_of(out)
    if kind is not None and kind is not EVAL_RUN:
        if resume:
            raise EvaluationError(
                f"{kind.named(out)}, not a run of explorer eval, so there is no run to resume; start "
                f"one with another {setting('out')} and without {setting('resume', True)} ({kind.taken_by(out)})"
            )
        raise EvaluationError(
            f"{kind.named(out)}, not a run of explorer eval; give the run a directory of its own with another {setting('out')} "
            f"({kind.taken_by(out)})"
        )
    if kind is EVAL_RUN and not resume:
        raise EvaluationError(
            f"{out}: already holds a run; pass {setting('resume', True)} to finish it, or choose another {setting('out')}"
        )
    if kind is None and resume:
        raise EvaluationError(f"{out}: no {MANIFEST}, so there is no run to resume; start one without {setting('resume', True)}")


def _check_run_file(path: Path) -> None:
    """Each file the run will write is absent or a regular file of its own, found before any
    episode runs: a FIFO, a link or a directory at scores.jsonl was found only when the run ended."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise EvaluationError(f"{path}: cannot be looked at ({error.strerror}); choose another {setting('out')}") from None
    if stat.S_ISDIR(mode):
        raise EvaluationError(f"{path}: is a directory where the run's file belongs; choose another {setting('out')}")
    if stat.S_ISLNK(mode):
        raise EvaluationError(f"{path}: a symbolic link where the run's own file belongs; remove it or choose another {setting('out')}")
    if not stat.S_ISREG(mode):
        raise EvaluationError(
            f"{path}: is not a regular file (a FIFO, socket or device) where the run's file belongs; choose another {setting('out')}"
        )


def resumed_manifest(out: Path) -> RunManifest:
    """The manifest of the run to finish, checked against its schema."""
    try:
        return read_manifest(out)
    except FileNotFoundError:
        raise EvaluationError(f"{out}: no {MANIFEST}, so there is no run to resume; start one without {setting('resume', True)}") from None


def eval_config(out: Path, overrides: dict[str, Any], config_file: Path | None = None, resume: bool = False) -> EvalConfig:
    """The run's config from dotted ``overrides`` (``policy.model``: the flags; None is not given).

    A new run: ``config_file`` (TOML), then the overrides. A resumed one: its manifest's config,
    then the file and the overrides - anything they change but how episodes are run is refused."""
    if not resume:  # a bad setting is named before the directory is looked at: it is wrong anywhere
        config = load_config(EvalConfig, config_file, overrides)
        check_out(out, resume)
        return config
    check_out(out, resume)
    manifest = resumed_manifest(out)
    from_file = dotted(read_toml(config_file)) if config_file is not None else {}
    given = {key: value for key, value in overrides.items() if value is not None}
    named = from_file | given
    config = build_config(EvalConfig, recorded_config(manifest), named, MANIFEST)
    refuse_changed_config(out, config, manifest)
    if SERVER_FIELD not in named:
        refuse_unnamed_server(out, config)
    if "ray" not in named:
        refuse_unnamed_cluster(out, config)
    return config


def recorded_config(manifest: RunManifest) -> dict[str, Any]:
    """The manifest's config without what the run derived; fields added since it was written
    have their defaults (the model filled them in), so that an older run still resumes."""
    return manifest.config.model_dump(mode="json", exclude=set(DERIVED_FIELDS))


def refuse_unnamed_server(out: Path, config: EvalConfig) -> None:
    """A resume whose requests would carry the user's key to a server only the run directory names
    is refused: the directory may be someone else's, and the key goes only where the user said."""
    from paper_explorer.agent.policies.servers import sends_key
    from paper_explorer.agent.policies.settings import server_urls

    urls = server_urls(config.policy)
    if config.policy.serving != "openai" or not urls or not sends_key():
        return
    raise EvaluationError(
        f"{out / MANIFEST}: names the server {', '.join(urls)}, which this command does not; OPENAI_API_KEY goes only to "
        f"servers named in the command: pass {setting('policy.base_url', urls)} (or your own server's URL) to resume against it, or unset OPENAI_API_KEY"
    )


def refuse_unnamed_cluster(out: Path, config: EvalConfig) -> None:
    """The same for a Ray cluster: a Ray run's tasks carry the key to the cluster's nodes, and its
    job table keeps it; a resume sends it only to a cluster its own command names."""
    from paper_explorer.agent.policies.servers import sends_key

    if config.ray is None or config.policy.serving != "openai" or not sends_key():
        return
    raise EvaluationError(
        f"{out / MANIFEST}: names the Ray cluster {config.ray}, which this command does not; OPENAI_API_KEY goes only to "
        f"clusters named in the command: pass {setting('ray', config.ray)} (or another cluster's address, or local) to resume on it, "
        "or unset OPENAI_API_KEY"
    )


def differing(now: dict[str, Any], then: dict[str, Any]) -> list[str]:
    """The settings that differ between two configs (dotted: ``policy``'s fields one by one), but
    those a resume may change: how episodes are run, and the server(s)."""
    now, then = dotted(now), dotted(then)
    free = {*EXECUTION_FIELDS, SERVER_FIELD}
    return sorted(key for key in set(now) | set(then) if now.get(key) != then.get(key) and key not in free)


def refuse_changed_config(out: Path, config: EvalConfig, manifest: RunManifest) -> None:
    """A config that differs from the run's manifest (but in how episodes are run, and where) is named and refused."""
    changed = differing(config.model_dump(mode="json"), recorded_config(manifest))
    if changed:
        raise EvaluationError(
            f"{out}: refusing to resume: the config differs from the run's manifest ({', '.join(changed)}); "
            f"use the original settings, or start a new run with another {setting('out')}"
        )


def check_resumable(out: Path, config: RecordedEvalConfig, hashes: Hashes) -> None:
    """The run about to be finished is the manifest's: the same config (what it selected included)
    and the same corpus and prompt hashes."""
    manifest = resumed_manifest(out)
    recorded = manifest.config.model_dump(mode="json")  # fields added since it was written: their defaults
    for name, keys in (
        ("corpus or prompt hashes", differing_settings(hashes, manifest.hashes)),
        ("config", differing(config.model_dump(mode="json"), recorded)),  # a resumed run may run them otherwise, and on another server
    ):
        if keys:
            raise EvaluationError(
                f"{out}: refusing to resume: the {name} differ from the run's manifest ({', '.join(keys)}); "
                f"use the original settings, or start a new run with another {setting('out')}"
            )


def logged_episodes(out: Path) -> dict[Key, Trajectory]:
    """The episode that counts per (question, sample) in the run's log (``run_directory.counted``),
    each line checked to be an episode of this run: a line from another run would be kept and
    scored as this one's. A torn last line is stepped around (the log's opening cuts it off)."""
    try:
        records, _ = read_log(out)
    except FileNotFoundError:
        return {}
    stranger = first_stranger(records, resumed_manifest(out))
    if stranger is not None:
        number, reason = stranger
        raise EvaluationError(
            f"{out / TRAJECTORIES}:{number}: not an episode of this run: {reason}; remove that line, or start a new run with another {setting('out')}"
        )
    return {episode_key(record.value): record.value for record in counted(records)}


def recorded_corpus(manifest: RunManifest | None) -> Path | None:
    """Without a corpus named: the corpus file (or folder) the run recorded, or None for the
    generated demo corpus (its hash is checked all the same)."""
    sources = manifest.corpus if manifest is not None else []
    if not sources or any(source.startswith(DEMO_SOURCE_PREFIX) for source in sources):
        return None
    missing = [source for source in sources if not Path(source).exists()]
    if missing:
        raise EvaluationError(f"the run's corpus {missing[0]} is gone; pass {setting('corpus')} with the same corpus (its hash is checked)")
    if len(sources) == 1:
        return Path(sources[0])
    folder = Path(sources[0]).parent  # a directory corpus records its files
    if all(Path(source).parent == folder for source in sources):
        return folder
    raise EvaluationError(f"the run's corpus was {len(sources)} files in several folders; pass {setting('corpus')} with the same corpus")


def resume_command(out: Path, questions: Path | None = None, retry_errors: bool = False) -> str:
    """The command that finishes the run in ``out``: its manifest holds the config and the corpus's
    path; a questions file is not recorded, so it is named again."""
    words = ["explorer", "eval", "--out", str(out), "--resume"]
    if questions is not None:
        words += ["--questions", str(questions)]
    if retry_errors:
        words.append("--retry-errors")
    return shlex.join(words)
