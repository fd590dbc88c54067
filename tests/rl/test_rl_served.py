"""explorer rl with a server sampling (--policy openai): the update trains the weights the server
serves, as its model list names them; one it cannot load here is refused in one line before
anything is written. (Sampling through a real vLLM: tests/integration/test_vllm_rl.py.)"""

import pytest

from tests.agent.test_openai_policy import FakeServer
from tests.conftest import run_cli


@pytest.mark.parametrize(
    "entry, said",
    [
        ({"id": "served"}, "lists no root for 'served', so the weights it samples are unknown"),
        ({"id": "served", "root": "/nowhere/qwen3-8b"}, "serves 'served' from /nowhere/qwen3-8b, which is no directory on this machine"),
        ({"id": "served", "root": "/srv/adapter", "parent": "base"}, "--model 'served' is an adapter"),
    ],
)
def test_a_served_model_whose_weights_cannot_be_trained_here_is_one_line_before_anything_is_written(tiny_tokenizer, tmp_path, entry, said):
    fake = FakeServer(models=[entry, {"id": "base", "root": "/srv/base"}])
    try:
        done = run_cli(
            "rl", "--policy", "openai", "--base-url", fake.url, "--model", "served", "--tokenizer", str(tiny_tokenizer),
            "--out", str(tmp_path / "out"),
        )  # fmt: skip
    finally:
        fake.server.shutdown()
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists() and not fake.requests
