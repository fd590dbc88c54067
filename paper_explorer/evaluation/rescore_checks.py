"""What ``explorer rescore`` checks in a run's records before it loads a model: which probes hold
probabilities, that none the config asked for is missing, that a probe recorded as not measured
really could not be, that the tokenizer and adapter are the run's, and that every probe's prompt
rebuilt from its trajectory is the one recorded. Each failure is a line naming the episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paper_explorer.agent.models import file_hashes
from paper_explorer.agent.policies.settings import adapter_of, served_adapter_of
from paper_explorer.agent.probes import option_ids, probe_prompt
from paper_explorer.agent.served import ids_sha256
from paper_explorer.agent.trajectory import ProbeResult, Trajectory
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.run_directory import Run

if TYPE_CHECKING:
    from paper_explorer.agent.probes import ProbeSet
    from paper_explorer.agent.renderer import ChatRenderer


@dataclass(frozen=True)
class Recorded:
    """One recorded probe that holds probabilities, with its episode."""

    trajectory: Trajectory
    result: ProbeResult

    def where(self) -> str:
        t = self.trajectory
        return f"episode {t.episode_id} (question {t.question_id}, sample {t.sample}), probe {self.result.probe}"


def recorded_probes(run: Run) -> tuple[list[Recorded], list[Recorded]]:
    """The counted episodes' probes: those that hold probabilities, and those recorded as not
    measured; a run with no probes at all is one EvaluationError line."""
    measured: list[Recorded] = []
    unmeasured: list[Recorded] = []
    for trajectory in run.trajectories:
        for result in trajectory.probes:
            (unmeasured if result.probabilities is None else measured).append(Recorded(trajectory, result))
    if not measured and not unmeasured:
        raise nothing_to_rescore(run, 0)
    return measured, unmeasured


def nothing_to_rescore(run: Run, unmeasured: int) -> EvaluationError:
    what = f"only probes recorded as not measured ({unmeasured})" if unmeasured else "no probes"
    return EvaluationError(f"{run.directory}: {what}, so nothing to rescore; record them with explorer eval --probe answerable")


def missing_probe(run: Run, probes: ProbeSet) -> str | None:
    """The first episode without a probe the run's config asked for (``correct`` only after a
    submit, as ``agent.probes.after_episode`` asks), or None: a dropped probe is a changed record."""
    asked = [probes.probes[name] for name in run.manifest.config.episode.probes if name in probes.probes]
    unknown = [name for name in run.manifest.config.episode.probes if name not in probes.probes]
    if unknown:
        return f"the run asked for the probe {unknown[0]}, which {probes.path} does not hold"
    for trajectory in run.trajectories:
        submitted = trajectory.outcome.status == "submitted"
        held = {result.probe for result in trajectory.probes}
        for probe in asked:
            if (submitted or not probe.only_if_submitted) and probe.name not in held:
                return (
                    f"episode {trajectory.episode_id} (question {trajectory.question_id}, sample {trajectory.sample}) "
                    f"has no probe {probe.name}, which the run's config asked for"
                )
    return None


def check_not_measured(renderer: ChatRenderer, probes: ProbeSet, item: Recorded) -> str | None:
    """Why a probe recorded as not measured was measurable, or None: the only reason accepted is
    the context's, and then its rebuilt prompt must leave no room for an option in the
    ``max_context`` the run's policy recorded (``agent.probes._measure_one``'s test)."""
    prompt, why = rebuilt_prompt(renderer, probes, item)
    if why is not None:
        return why
    reason = item.result.not_measured or "no reason"
    context = item.trajectory.policy.settings.get("max_context")
    if "leaves no room for an option in the context of" not in reason:
        return f"{item.where()}: recorded as not measured ({reason}), but it is measurable"
    if not isinstance(context, int) or isinstance(context, bool):
        return f"{item.where()}: recorded as not measured ({reason}), but the run's policy recorded no max_context to confirm it"
    if len(prompt) + 1 <= context:
        return (
            f"{item.where()}: recorded as not measured ({reason}), but it is measurable: its prompt of "
            f"{len(prompt)} tokens fits the recorded max_context of {context}"
        )
    return None


def check_tokenizer(renderer: ChatRenderer, recorded: list[Recorded], model: str) -> list[str]:
    """A model whose tokenizer is not the run's is refused; a run that did not record its
    tokenizer's digest is said (notes)."""
    unrecorded = 0
    for item in recorded:
        fingerprint = item.trajectory.policy.settings.get("tokenizer_sha256")
        if fingerprint is None:
            unrecorded += 1
        elif fingerprint != renderer.fingerprint:
            raise EvaluationError(
                f"{setting('model', model)}: its tokenizer ({renderer.fingerprint[:12]}) is not the one episode "
                f"{item.trajectory.episode_id} was served with ({fingerprint[:12]}); name the run's model"
            )
    return [f"{unrecorded} probes' episodes recorded no tokenizer digest: not checked"] if unrecorded else []


def check_adapter(adapter: Path | None, run: Run, recorded: list[Recorded]) -> None:
    """The adapter given must be the one the run used, file for file (hf: each file's SHA-256 in the
    policy settings; openai: the one digest of the adapter eval loaded into the server)."""
    settings = recorded[0].trajectory.policy.settings
    served = served_adapter_of(run.manifest.config.policy)
    used = settings.get("adapter") or (served.path if served is not None else None) or adapter_of(run.manifest.config.policy)
    if adapter is None:
        if used is not None:
            raise EvaluationError(f"the run's policy used the adapter {used}; pass it as {setting('adapter')}")
        return
    if used is None:
        raise EvaluationError(f"{setting('adapter', adapter)}: the run used no adapter; rescore it without one")
    if not (adapter / "adapter_config.json").is_file():
        raise EvaluationError(f"{setting('adapter', adapter)}: not a LoRA adapter directory (no adapter_config.json)")
    hashes = settings.get("adapter_sha256")
    if isinstance(hashes, dict):
        same_adapter_files(adapter, hashes)
    elif served is not None:
        from paper_explorer.agent.policies.adapters import adapter_sha256

        now = adapter_sha256(adapter)
        if now != served.sha256:
            raise EvaluationError(
                f"{setting('adapter', adapter)}: its files are not the run's (SHA-256 {now[:12]}, the run's {served.sha256[:12]})"
            )


def same_adapter_files(adapter: Path, recorded: dict[str, str]) -> None:
    now = file_hashes(adapter)
    for name in sorted(set(recorded) | set(now)):
        if name not in now:
            raise EvaluationError(f"{setting('adapter', adapter)}: has no {name}, which the run's adapter had")
        if name not in recorded:
            raise EvaluationError(f"{setting('adapter', adapter)}: has {name}, which the run's adapter did not")
        if now[name] != recorded[name]:
            raise EvaluationError(
                f"{setting('adapter', adapter)}: {name} is not the run's (SHA-256 {now[name][:12]}, the run's {recorded[name][:12]})"
            )


def rebuilt_prompt(renderer: ChatRenderer, probes: ProbeSet, item: Recorded) -> tuple[list[int], str | None]:
    """The probe's prompt rebuilt from the trajectory, and why it is not the recorded one (None: it is)."""
    result = item.result
    if result.probes_sha256 != probes.sha256:
        now = f"{probes.path} is {probes.sha256[:12]} now"
        return [], f"{item.where()}: recorded with a probes file of SHA-256 {result.probes_sha256[:12]}; {now}"
    probe = probes.probes.get(result.probe)
    if probe is None or list(probe.options) != result.options:
        return [], f"{item.where()}: the probes file holds no probe of that name and options {result.options}"
    if option_ids(renderer, probe) != result.option_ids:
        return [], f"{item.where()}: the options' tokens are {option_ids(renderer, probe)}, recorded {result.option_ids}"
    prompt = probe_prompt(renderer, item.trajectory.messages(), probe)
    if ids_sha256(prompt) != result.prompt_sha256 or len(prompt) != result.prompt_tokens:
        return prompt, (
            f"{item.where()}: its prompt rebuilt from the trajectory ({len(prompt)} tokens, SHA-256 "
            f"{ids_sha256(prompt)[:12]}) is not the recorded one ({result.prompt_tokens} tokens, {result.prompt_sha256[:12]})"
        )
    return prompt, None


# -- recomputing --------------------------------------------------------------------------------
