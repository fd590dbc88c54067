"""eval --resume and the user's key: a run directory may come from someone else, so the server its
manifest names gets ``OPENAI_API_KEY`` only when the resuming command names that server itself.

Each server here is a real local HTTP server that records the Authorization header of every request."""

import pytest

from tests.conftest import run_cli
from tests.test_concurrency import openai_eval, scripted_server

KEY = "sk-the-users-own-key-0123456789"


@pytest.fixture
def their_run(tiny_tokenizer, tmp_path):
    """A run of 3 episodes made against "their" server (no key sent), cut to its first episode, as
    someone else would hand it over; the server stays up, recording what reaches it."""
    theirs = scripted_server(tiny_tokenizer)
    out = tmp_path / "their-run"
    made = openai_eval([theirs.url], tiny_tokenizer, out, "--limit", "3", "--max-steps", "4")
    assert made.returncode == 0, made.stderr
    log = out / "trajectories.jsonl"
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    theirs.authorizations.clear()
    yield out, theirs
    theirs.server.shutdown()
    theirs.server.server_close()


def test_a_resume_with_a_key_never_sends_it_to_the_server_only_the_manifest_names(their_run, tmp_path):
    out, theirs = their_run
    done = run_cli("eval", "--out", str(out), "--resume", env={"OPENAI_API_KEY": KEY})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"names the server {theirs.url}" in done.stderr and f"pass --base-url {theirs.url}" in done.stderr, done.stderr
    assert theirs.authorizations == []  # not a single request, so not the key

    config = tmp_path / "eval.toml"  # a config file that names no server does not name it either
    config.write_text("concurrency = 2\n")
    done = run_cli("eval", "--out", str(out), "--resume", "--config", str(config), env={"OPENAI_API_KEY": KEY})
    assert done.returncode == 2 and "pass --base-url" in done.stderr, done.stderr
    assert theirs.authorizations == []
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 1  # nothing ran


def test_a_server_named_with_base_url_gets_the_key_and_the_recorded_one_gets_nothing(their_run, tiny_tokenizer):
    out, theirs = their_run
    mine = scripted_server(tiny_tokenizer)
    try:
        done = run_cli("eval", "--out", str(out), "--resume", "--base-url", mine.url, env={"OPENAI_API_KEY": KEY})
        assert done.returncode == 0, done.stderr
        assert mine.authorizations and set(mine.authorizations) == {f"Bearer {KEY}"}
        assert theirs.authorizations == []
        assert len((out / "trajectories.jsonl").read_text().splitlines()) == 3
    finally:
        mine.server.shutdown()
        mine.server.server_close()


def test_the_recorded_server_is_named_again_in_a_config_file(their_run, tmp_path):
    out, theirs = their_run
    config = tmp_path / "eval.toml"
    config.write_text(f'[policy]\nbase_url = "{theirs.url}"\n')
    done = run_cli("eval", "--out", str(out), "--resume", "--config", str(config), env={"OPENAI_API_KEY": KEY})
    assert done.returncode == 0, done.stderr
    assert theirs.authorizations and set(theirs.authorizations) == {f"Bearer {KEY}"}  # the user named it: their choice


@pytest.mark.parametrize("no_key", ["", "EMPTY"])
def test_without_a_key_the_recorded_server_is_reused(their_run, no_key):
    out, theirs = their_run
    done = run_cli("eval", "--out", str(out), "--resume", env={"OPENAI_API_KEY": no_key})
    assert done.returncode == 0, done.stderr
    assert theirs.authorizations and set(theirs.authorizations) == {f"Bearer {no_key}"}


def test_naming_a_server_changes_nothing_else_a_resume_may_not_change(their_run, tiny_tokenizer):
    out, theirs = their_run
    done = run_cli("eval", "--out", str(out), "--resume", "--base-url", theirs.url, "--model", "another", env={"OPENAI_API_KEY": KEY})
    assert done.returncode == 2 and "the config differs from the run's manifest (policy.model)" in done.stderr, done.stderr
    assert theirs.authorizations == []
