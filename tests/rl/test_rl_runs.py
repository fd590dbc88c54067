"""explorer rl as a user runs it, on the tiny random-weight model: rounds recorded and resumable,
parity between what was sampled and what was trained, the update's direction, the memory reader."""

import json

import pytest

from paper_explorer.agent.models import file_hashes
from paper_explorer.corpus import DemoConfig, generate
from tests.conftest import explorer_command, killed_once_logged, run_cli, run_cli_process

pytest.importorskip("torch")

SMALL = ("--questions-per-round", "2", "--group-size", "3", "--max-new-tokens", "12", "--max-steps", "2", "--threads", "1")


def rl(tiny_model, out, *flags):
    return run_cli("rl", "--model", str(tiny_model), "--out", str(out), *SMALL, *flags)


@pytest.fixture(scope="module")
def one_round(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("rl") / "run"
    done = rl(tiny_model, out, "--rounds", "1", "--validation-episodes", "2", "--kl-beta", "0.01")
    assert done.returncode == 0, done.stderr
    return out, done


def test_a_round_writes_its_samples_rewards_update_and_validation(one_round):
    out, done = one_round
    round_1 = out / "round-1"
    record = json.loads((round_1 / "round.json").read_text())
    assert record["episodes"] == 6 and record["groups"] == 2 and record["sampled_with"] == "base"
    assert record["update"]["tokens_trained"] > 0 and record["update"]["kl"] is not None
    # the sampler's and the trainer's log-probabilities of the same tokens agree (fp32, one process)
    assert record["update"]["sampler_logprob_gap_max"] < 1e-3
    assert record["sampled_tokens"] >= record["update"]["tokens_trained"]
    assert (round_1 / "update" / "adapter" / "adapter_config.json").exists() and (round_1 / "update" / "optimizer.pt").exists()
    rewards = [json.loads(line) for line in (round_1 / "rewards.jsonl").read_text().splitlines()]
    assert len(rewards) == 6 and all(set(r["parts"]) == {"answer_f1", "direct_submit", "format_errors"} for r in rewards)
    assert record["reward_mean"] == pytest.approx(sum(r["reward"] for r in rewards) / 6)
    # the samples and the validations are eval runs: inspect and compare read them
    assert run_cli("inspect", str(round_1 / "samples")).returncode == 0
    compared = run_cli("compare", str(out / "round-0" / "validation"), str(round_1 / "validation"))
    assert compared.returncode == 0, compared.stderr
    shown = run_cli("inspect", str(out))
    assert shown.returncode == 0 and "explorer rl" in shown.stdout and "round" in shown.stdout
    assert "round 1: reward" in done.stdout


def test_check_parity_proves_the_trained_ids_are_the_sampled_ids_and_catches_an_edit(one_round, tiny_model, tmp_path):
    out, _ = one_round
    held = run_cli("check-parity", "--rl", str(out), "--tokenizer", str(tiny_model))
    assert held.returncode == 0 and "rl parity holds: 1 rounds" in held.stdout, held.stdout + held.stderr
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    batch = edited / "round-1" / "batch.jsonl"
    lines = batch.read_text().splitlines()
    first = json.loads(lines[0])
    first["input_ids"][first["trained"][0]] += 1  # one trained token that was never sampled
    batch.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    broken = run_cli("check-parity", "--rl", str(edited), "--tokenizer", str(tiny_model))
    assert broken.returncode == 1 and "parity broken" in broken.stderr and "input_ids differ" in broken.stderr


def test_a_rerun_resumes_and_other_settings_are_refused(one_round, tiny_model):
    out, _ = one_round
    before = file_hashes(out / "round-1")
    again = rl(tiny_model, out, "--rounds", "1", "--validation-episodes", "2", "--kl-beta", "0.01")
    assert again.returncode == 0 and "1 rounds done" in again.stdout
    assert file_hashes(out / "round-1") == before
    other = rl(tiny_model, out, "--rounds", "1", "--validation-episodes", "2", "--kl-beta", "0.02")
    assert other.returncode == 2 and "other settings (kl_beta)" in other.stderr and "Traceback" not in other.stderr


@pytest.mark.parametrize(
    "flags, said",
    [
        (("--group-size", "1"), "group_size must be at least 2"),
        (("--reward", "answer_f2=1"), "reward part 'answer_f2' does not exist (did you mean 'answer_f1'?)"),
        (("--reward", "answer_f1"), "write PART=WEIGHT"),
        (("--temperature", "0"), "must be above 0"),
        (("--policy", "scripted"), "not 'scripted'"),
        (("--adapter", "nowhere"), "nowhere: no adapter_config.json"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(tiny_model, tmp_path, flags, said):
    done = rl(tiny_model, tmp_path / "out", *flags)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out" / "round-1").exists()


def toy_detector(trajectory, gold):
    """Flags an episode whose first drawn token has an even id: a reward the tiny model can learn in one step."""
    from paper_explorer.evaluation.detectors import Flag

    first = trajectory.steps[0].served.sampled.ids[0] if trajectory.steps and trajectory.steps[0].served else None
    return [Flag("even_first_token", 0, str(first))] if first is not None and first % 2 == 0 else []


def sequence_logprobs(model_directory, adapter, batch) -> list[float]:
    """Each trained sequence's log-probability of its drawn tokens, computed apart from the trainer's code."""
    import torch

    from paper_explorer.agent.policies.hf import HFPolicy

    policy = HFPolicy.load(str(model_directory), adapter=adapter)
    found = []
    for sequence in batch:
        with torch.inference_mode():
            logits = policy.model(input_ids=torch.tensor([sequence["input_ids"]])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        found.append(sum(float(logprobs[p - 1, sequence["input_ids"][p]]) for p in sequence["trained"]))
    return found


@pytest.mark.parametrize("weight", [1.0, -1.0])
def test_one_update_moves_the_policy_toward_a_toy_reward(tiny_model, tmp_path, monkeypatch, weight):
    """Would fail with the sign of the gradient wrong: the update makes the rewarded episodes' tokens likelier, whichever they are."""
    from paper_explorer.agent.config import build_config
    from paper_explorer.evaluation import detectors
    from paper_explorer.rl.config import RLConfig
    from paper_explorer.rl.run import reinforce

    monkeypatch.setitem(detectors.DETECTORS, "even_first_token", toy_detector)
    settings = {"policy.model": str(tiny_model), "policy.max_new_tokens": 2, "policy.threads": 1, "episode.max_steps": 1}
    settings |= {"rounds": 1, "questions_per_round": 2, "group_size": 8, "validation_episodes": 0, "kl_beta": 0.0}
    settings |= {"learning_rate": 0.01, "minibatches": 1, "reward": {"even_first_token": weight}}
    config = build_config(RLConfig, {}, settings, "test")
    corpus = generate(DemoConfig(papers=6, seed=3))
    reinforce(config, out=tmp_path / "rl", corpus=corpus, log=lambda line: None)
    batch = [json.loads(line) for line in (tmp_path / "rl" / "round-1" / "batch.jsonl").read_text().splitlines()]
    assert {sequence["advantage"] > 0 for sequence in batch} == {True, False}  # the toy reward split every group
    before = sequence_logprobs(tiny_model, None, batch)
    after = sequence_logprobs(tiny_model, tmp_path / "rl" / "round-1" / "update" / "adapter", batch)
    # the episodes with a positive advantage became likelier and the others rarer, on balance
    moved = sum(sequence["advantage"] * (then - now) for sequence, now, then in zip(batch, before, after))
    assert moved > 0.1, moved
    changes = {True: [], False: []}  # by whether the toy reward paid for the episode (its first token's parity)
    for sequence, now, then in zip(batch, before, after):
        changes[(sequence["input_ids"][sequence["trained"][0]] % 2 == 0) == (weight > 0)].append(then - now)
    assert sum(changes[True]) / len(changes[True]) > sum(changes[False]) / len(changes[False])


@pytest.mark.slow
def test_kill_9_mid_round_and_resume_gives_the_adapters_and_records_of_an_uninterrupted_run(tiny_model, tmp_path):
    flags = ["--model", str(tiny_model), *SMALL, "--rounds", "2", "--validation-episodes", "0", "--questions-per-round", "2"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    done = run_cli_process("rl", "--out", str(whole), *flags)
    assert done.returncode == 0, done.stderr
    killed_once_logged(explorer_command("rl", "--out", str(resumed), *flags), resumed / "round-2" / "samples" / "trajectories.jsonl", 1)
    assert not (resumed / "round-2" / "round.json").exists()
    finished = run_cli_process("rl", "--out", str(resumed), *flags)
    assert finished.returncode == 0, finished.stderr
    for number in (1, 2):
        ours, theirs = whole / f"round-{number}", resumed / f"round-{number}"
        assert file_hashes(ours / "update" / "adapter") == file_hashes(theirs / "update" / "adapter")
        for name in ("rewards.jsonl", "batch.jsonl"):
            assert (ours / name).read_bytes() == (theirs / name).read_bytes()
        records = [json.loads((path / "round.json").read_text().replace(str(path.parent), "OUT")) for path in (ours, theirs)]
        for record in records:
            record.pop("seconds")
        assert records[0] == records[1]


def test_the_memory_reader_trains_each_update_and_its_answer_as_a_conversation(tiny_model, tmp_path):
    recipe = ("--scope", "paper", "--page-tokens", "256", "--memory-tokens", "24", "--answer-tokens", "12")
    out = tmp_path / "reader"
    done = run_cli(
        "rl", "--policy", "memory-reader", "--backend", "hf", "--model", str(tiny_model), *recipe, "--out", str(out), "--threads", "1",
        "--rounds", "1", "--questions-per-round", "1", "--group-size", "2", "--validation-episodes", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    from paper_explorer.agent.writer import read_trajectories

    episodes = read_trajectories(out / "round-1" / "samples" / "trajectories.jsonl")
    batch = [json.loads(line) for line in (out / "round-1" / "batch.jsonl").read_text().splitlines()]
    for episode in episodes:
        reading = next(s.policy_info.reading for s in episode.steps if s.policy_info and s.policy_info.reading)
        conversations = [b["conversation"] for b in batch if b["episode_id"] == episode.episode_id]
        expected = [f"update {n}" for n in range(1, len(reading.updates) + 1)] + (["answer"] if reading.answer else [])
        assert conversations == expected and len(expected) >= 2
        for update in reading.updates:  # the caps held while sampling, as in evaluation
            assert len(update.served.sampled.ids) <= 24 and update.memory_tokens_out <= 24
        for sequence in (b for b in batch if b["episode_id"] == episode.episode_id):
            assert sequence["trained"] == list(range(len(sequence["input_ids"]) - len(sequence["trained"]), len(sequence["input_ids"])))
    held = run_cli("check-parity", "--rl", str(out), "--tokenizer", str(tiny_model))
    assert held.returncode == 0, held.stdout + held.stderr


def resumed(tiny_model, out):
    """The command that made one_round, run again on ``out``."""
    return rl(tiny_model, out, "--rounds", "1", "--validation-episodes", "2", "--kl-beta", "0.01")


def before_the_update(one_round, tmp_path):
    """A copy of one_round as a kill after its rewards and batch were written leaves it."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(one_round[0], out)
    shutil.rmtree(out / "round-1" / "update")
    for name in ("round-1/round.json", "rl_summary.json"):
        (out / name).unlink()
    return out


def edited_line(path, edit):
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    edit(first)
    path.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")


@pytest.mark.parametrize(
    "name, edit, said",
    [
        ("batch.jsonl", lambda line: line.update(advantage=line["advantage"] + 5), "batch.jsonl:1: is not what the round's samples give"),
        ("batch.jsonl", lambda line: line["trained"].__setitem__(0, 0), "a trained position outside 1.."),
        ("batch.jsonl", lambda line: line["old_logprobs"].pop(), "trained positions but"),
        ("batch.jsonl", lambda line: line["old_logprobs"].__setitem__(0, 3.0), "not a finite number at most 0"),
        ("rewards.jsonl", lambda line: line.update(reward=9.0), "rewards.jsonl:1: is not what the round's samples give"),
    ],
)
def test_a_batch_edited_before_the_update_is_refused_never_trained(one_round, tiny_model, tmp_path, name, edit, said):
    out = before_the_update(one_round, tmp_path)
    edited_line(out / "round-1" / name, edit)
    done = resumed(tiny_model, out)
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (out / "round-1" / "update").exists()


def test_a_moved_run_resumes_and_reports_its_adapters_where_they_are_now(one_round, tiny_model, tmp_path):
    import shutil

    out = tmp_path / "moved"
    shutil.copytree(one_round[0], out)
    (out / "rl_summary.json").unlink()
    record = json.loads((out / "round-1" / "round.json").read_text())  # as if round 1 had validated best, to be chosen
    record["validation"] |= {"answer_f1": 1.0, "direct_submit_rate": 0.0}
    (out / "round-1" / "round.json").write_text(json.dumps(record))
    done = resumed(tiny_model, out)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "rl_summary.json").read_text())
    assert summary["best_round"] == 1 and summary["best_adapter"] == str(out / "round-1" / "update" / "adapter")


@pytest.mark.parametrize("forgery", ["adapter elsewhere", "update a link", "optimizer edited"])
def test_a_forged_round_is_refused_before_the_next_round_trains_on_it(one_round, tiny_model, tmp_path, forgery):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(one_round[0], out)
    round_1 = out / "round-1"
    if forgery == "adapter elsewhere":  # a round.json pointing at another run's adapter, with that adapter's hashes
        other = tmp_path / "other" / "adapter"
        shutil.copytree(round_1 / "update" / "adapter", other)
        record = json.loads((round_1 / "round.json").read_text())
        (round_1 / "round.json").write_text(json.dumps(record | {"adapter": str(other)}))
        said = "is not the round's own"
    elif forgery == "update a link":  # the same bytes, but somewhere else: what the round trains from is its own
        shutil.move(round_1 / "update", tmp_path / "update")
        (round_1 / "update").symlink_to(tmp_path / "update")
        said = "update: a symbolic link"
    else:
        with open(round_1 / "update" / "optimizer.pt", "ab") as state:
            state.write(b"\0")
        said = "optimizer.pt is missing or not the one the round recorded"
    done = resumed(tiny_model, out)
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_ctrl_c_during_the_update_says_how_to_resume_and_the_resume_gives_the_same_adapter(one_round, tiny_model, tmp_path, monkeypatch):
    import paper_explorer.rl.update as update_module

    out = before_the_update(one_round, tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(update_module, "update", interrupted)
        stopped = resumed(tiny_model, out)
    assert stopped.returncode == 130 and "interrupted" in stopped.stderr and "resume with: explorer rl" in stopped.stderr
    assert not (out / "round-1" / "update").exists()
    done = resumed(tiny_model, out)
    assert done.returncode == 0, done.stderr
    assert file_hashes(out / "round-1" / "update" / "adapter") == file_hashes(one_round[0] / "round-1" / "update" / "adapter")


@pytest.mark.parametrize("logprob", [float("-inf"), float("nan"), 0.5])
def test_a_sampled_log_probability_no_probability_has_is_refused_before_it_is_trained(one_round, logprob):
    from paper_explorer.agent.trajectory import Trajectory
    from paper_explorer.rl.sequences import SequenceRefused, sequences_of

    line = json.loads((one_round[0] / "round-1" / "samples" / "trajectories.jsonl").read_text().splitlines()[0])
    line["steps"][0]["served"]["sampled"]["logprobs"][0] = logprob  # in memory: JSON has no inf or NaN to write it with
    with pytest.raises(SequenceRefused, match="a sampled log-probability of .*which no probability has"):
        sequences_of(Trajectory.model_validate(line))


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda s: s.model_copy(update={"old_logprobs": [-1e30] * len(s.trained), "advantage": -1.0}), "its loss is inf"),
        (lambda s: s.model_copy(update={"old_logprobs": [-1e30] * len(s.trained), "advantage": 1.0}), "gradient norm is nan"),
        (lambda s: s.model_copy(update={"input_ids": [*s.input_ids[:-1], 10**9]}), "is not in the model's"),
    ],
)
def test_an_update_that_would_write_nan_or_index_past_the_vocabulary_is_refused(one_round, tiny_model, edit, said):
    """A ratio of exp(1e30) turns the gradient into NaN (0 * inf through the clipped branch): the
    update stops before a step, so no NaN adapter is ever saved for the next round to sample."""
    from paper_explorer.agent.config import build_config
    from paper_explorer.rl.config import RLConfig
    from paper_explorer.rl.sequences import TrainingSequence
    from paper_explorer.rl.update import UpdateRefused, load_trainable, make_optimizer, update

    config = build_config(RLConfig, {}, {"policy.model": str(tiny_model), "minibatches": 1, "gradient_checkpointing": False}, "test")
    line = (one_round[0] / "round-1" / "batch.jsonl").read_text().splitlines()[0]
    sequence = edit(TrainingSequence.model_validate_json(line))
    model, _ = load_trainable(config, None)
    optimizer = make_optimizer(model, config, None)
    before = [parameter.detach().clone() for parameter in model.parameters() if parameter.requires_grad]
    with pytest.raises(UpdateRefused, match=said):
        update(model, optimizer, [sequence], config, seed=0)
    after = [parameter for parameter in model.parameters() if parameter.requires_grad]
    assert all(bool((old == new).all()) for old, new in zip(before, after))


def test_a_resume_on_a_corpus_that_changed_is_refused_not_run_on_other_questions(tiny_model, tmp_path):
    from paper_explorer.agent.config import build_config
    from paper_explorer.rl.config import RLConfig
    from paper_explorer.rl.run import reinforce
    from paper_explorer.sft.errors import TrainingError

    settings = {"policy.model": str(tiny_model), "policy.max_new_tokens": 2, "policy.threads": 1, "episode.max_steps": 1}
    settings |= {"rounds": 1, "questions_per_round": 1, "group_size": 2, "validation_episodes": 0, "minibatches": 1}
    config = build_config(RLConfig, {}, settings, "test")
    reinforce(config, out=tmp_path / "rl", corpus=generate(DemoConfig(papers=6, seed=3)), log=lambda line: None)
    with pytest.raises(TrainingError, match="sampled other train questions than the corpus gives round 1 now"):
        reinforce(config, out=tmp_path / "rl", corpus=generate(DemoConfig(papers=6, seed=4)), log=lambda line: None)


def test_check_parity_passes_over_a_round_killed_between_its_batch_and_its_rewards(one_round, tiny_model, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(one_round[0], out)
    (out / "round-1" / "rewards.jsonl").unlink()
    done = run_cli("check-parity", "--rl", str(out), "--tokenizer", str(tiny_model))
    assert done.returncode == 2 and "no round has trained yet" in done.stderr, done.stderr


def test_a_seed_at_the_top_of_its_range_seeds_the_update_instead_of_overflowing(tiny_model, tmp_path):
    """torch takes a seed below 2**64: a round's seed + N past it stopped the update with a traceback."""
    from paper_explorer.agent.config import build_config
    from paper_explorer.rl.config import RLConfig
    from paper_explorer.rl.run import reinforce

    settings = {"policy.model": str(tiny_model), "policy.max_new_tokens": 2, "policy.threads": 1, "episode.max_steps": 1}
    settings |= {"rounds": 1, "questions_per_round": 1, "group_size": 2, "validation_episodes": 0, "episode.seed": 2**64 - 1}
    config = build_config(RLConfig, {}, settings, "test")
    assert reinforce(config, out=tmp_path / "rl", corpus=generate(DemoConfig(papers=6, seed=3)), log=lambda line: None).rounds == 1


def test_samples_drawn_or_begun_by_another_adapter_than_the_round_trains_from_are_refused(one_round):
    """Round 1 of one_round sampled the base: as the samples of a round whose previous round was
    trained again (differently) since, or of a run moved mid-round, they are refused, not trained off-policy."""
    from paper_explorer.evaluation.run_directory import Run
    from paper_explorer.rl.checks import began_with, drawn_with
    from paper_explorer.sft.errors import TrainingError

    out, _ = one_round
    samples, other = out / "round-1" / "samples", out / "round-1" / "update" / "adapter"
    drawn_with(Run.load(samples), "round 1 trains from", None)
    began_with(samples, "round 1 began sampling", None)
    with pytest.raises(
        TrainingError, match="was drawn by another adapter than .*adapter, which round 1 trains from; remove .*samples to run it again"
    ):
        drawn_with(Run.load(samples), "round 1 trains from", other)
    with pytest.raises(TrainingError, match="round 1 began sampling with the base, not .*adapter \\(was the run moved\\?\\); remove"):
        began_with(samples, "round 1 began sampling", other)


@pytest.mark.parametrize("persistent", [False, True])
def test_an_episode_the_sampler_failed_is_sampled_again_never_rewarded(tiny_model, tmp_path, monkeypatch, persistent):
    """A policy_error (a server gone, a bug) is the sampler's failure, not the model's choice: rewarded,
    it would teach the model to avoid the tokens it drew before the failure."""
    from paper_explorer.agent.config import build_config
    from paper_explorer.agent.policies.hf import HFPolicy
    from paper_explorer.rl.config import RLConfig
    from paper_explorer.rl.run import reinforce
    from paper_explorer.sft.errors import TrainingError

    failures = {"left": 1}
    original_start, original_act = HFPolicy.start, HFPolicy.act

    def start(self, episode):
        self.failing = episode.sample == 0 and failures["left"] > 0
        if self.failing and not persistent:
            failures["left"] -= 1
        return original_start(self, episode)

    def act(self, messages):
        if self.failing:
            raise RuntimeError("the server went away")
        return original_act(self, messages)

    monkeypatch.setattr(HFPolicy, "start", start)
    monkeypatch.setattr(HFPolicy, "act", act)
    settings = {"policy.model": str(tiny_model), "policy.max_new_tokens": 2, "policy.threads": 1, "episode.max_steps": 1}
    settings |= {"rounds": 1, "questions_per_round": 1, "group_size": 2, "validation_episodes": 0, "minibatches": 1}
    config = build_config(RLConfig, {}, settings, "test")
    corpus = generate(DemoConfig(papers=6, seed=3))
    if persistent:
        with pytest.raises(TrainingError, match="1 episodes ended in policy_error again when retried .*the server went away"):
            reinforce(config, out=tmp_path / "rl", corpus=corpus, log=lambda line: None)
        assert not (tmp_path / "rl" / "round-1" / "rewards.jsonl").exists()
        return
    reinforce(config, out=tmp_path / "rl", corpus=corpus, log=lambda line: None)
    rewards = [json.loads(line) for line in (tmp_path / "rl" / "round-1" / "rewards.jsonl").read_text().splitlines()]
    assert len(rewards) == 2 and "policy_error" not in {reward["status"] for reward in rewards}


def test_more_rounds_continue_a_finished_run_and_leave_its_rounds_as_they_were(one_round, tiny_model, tmp_path):
    """--rounds (and --report-to) may change on a resume: the rounds done are kept, the next ones train from the last."""
    import shutil

    out = tmp_path / "longer"
    shutil.copytree(one_round[0], out)
    before = file_hashes(out / "round-1")
    done = rl(tiny_model, out, "--rounds", "2", "--validation-episodes", "2", "--kl-beta", "0.01")
    assert done.returncode == 0, done.stderr
    assert file_hashes(out / "round-1") == before and json.loads((out / "rl.json").read_text())["rounds"] == 2
    second = json.loads((out / "round-2" / "round.json").read_text())
    assert second["sampled_with"].endswith("round-1/update/adapter") and json.loads((out / "rl_summary.json").read_text())["rounds"] == 2
