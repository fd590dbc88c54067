"""What a replay (``--policy replay``) found: which recorded observations the current runtime
reproduced, per episode (``compared_observations``) and over a run (``replay_drift``: the run's
``RunMetrics.replay``, and ``explorer run``'s for one episode)."""

from __future__ import annotations

from paper_explorer.agent.trajectory import Drift, Trajectory
from paper_explorer.evaluation.records import FirstChange, ReplayDrift


def replay_drift(trajectories: list[Trajectory]) -> ReplayDrift | None:
    """How many recorded observations a replay reproduced, and where the first one it did not
    differs (None when no episode was replayed)."""
    replayed = [t for t in trajectories if t.policy.name == "replay"]
    if not replayed:
        return None
    steps = compared = changed = episodes_changed = 0
    first: FirstChange | None = None
    for trajectory in replayed:
        steps += sum(1 for step in trajectory.steps if step.policy_info and step.policy_info.replayed_step is not None)
        observations = compared_observations(trajectory)
        changes = [(index, drift) for index, matches, drift in observations if not matches]
        compared += len(observations)
        changed += len(changes)
        episodes_changed += bool(changes)
        located = [(index, drift) for index, drift in changes if drift is not None]
        if first is None and located:
            index, drift = located[0]
            first = FirstChange(
                episode_id=trajectory.episode_id,
                question_id=trajectory.question_id,
                step=index,
                position=drift.position,
                recorded=drift.recorded,
                current=drift.current,
            )
    return ReplayDrift(
        episodes=len(replayed),
        steps=steps,
        observations_compared=compared,
        observations_changed=changed,
        episodes_changed=episodes_changed,
        first_change=first,
    )


def compared_observations(trajectory: Trajectory) -> list[tuple[int, bool, Drift | None]]:
    """(step index, matches, where it differs) for each observation a replay compared with its
    recording. A step reports on the observation of the step before it (what the policy saw
    before acting); the last step also reports on its own, in ``final_observation_matches``."""
    compared = []
    for step in trajectory.steps:
        info = step.policy_info
        if info is None:
            continue
        for matches, drift, index in (
            (info.previous_observation_matches, info.drift, step.index - 1),
            (info.final_observation_matches, info.final_drift, step.index),
        ):
            if matches is not None:
                compared.append((index, matches, drift))
    return compared
