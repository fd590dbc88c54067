"""Adapters loaded into a server under names that cannot be confused (agent.policies.adapters),
against a fake that answers the LoRA endpoints and /v1/models the way vLLM does; one rule a test.
tests/integration/test_vllm_adapters.py checks the same against a real vLLM."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.adapters import ServerAdapters, adapter_sha256, planned_adapter, run_id
from tests.conftest import run_cli

SUBMIT = '```python\nsubmit("3e-5", evidence=[])\n```'


class FakeVllm:
    """vLLM's runtime LoRA as measured: a name loaded twice is a 400 "already loaded" whatever the
    path; a directory it cannot read is a 404; success answers are plain text; /v1/models lists
    each adapter with id = name, root = path, parent = the base model. ``lie`` makes /v1/models
    list every adapter from that path instead; ``runtime_lora=False`` is a server without the
    endpoints (404 Not Found). Completions answer a submit and record the model they were asked for."""

    def __init__(self, base: str = "served", lie: str | None = None, runtime_lora: bool = True, echo: str = ""):
        self.base, self.lie, self.runtime_lora, self.echo = base, lie, runtime_lora, echo
        self.adapters: dict[str, str] = {}  # name -> path, as loaded
        self.events: list[tuple] = []  # ("load", name, path) / ("unload", name) / ("complete", model), in order
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                listed = [{"id": fake.base, "object": "model", "root": "/models/base", "max_model_len": 4096}]
                listed += [
                    {"id": name, "object": "model", "root": fake.lie or path, "parent": fake.base} for name, path in fake.adapters.items()
                ]
                self.answer(200, json.dumps({"object": "list", "data": listed}))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/completions"):
                    fake.events.append(("complete", body["model"]))
                    completion = {
                        "choices": [{"text": SUBMIT, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 9},
                    }
                    self.answer(200, json.dumps(completion))
                elif not fake.runtime_lora:
                    self.answer(404, json.dumps({"detail": "Not Found"}))
                elif self.path.endswith("/load_lora_adapter"):
                    self.answer(*fake.load(body["lora_name"], body["lora_path"], body.get("load_inplace", False)))
                elif self.path.endswith("/unload_lora_adapter"):
                    self.answer(*fake.unload(body["lora_name"]))

            def answer(self, status, text):
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def load(self, name, path, inplace):
        if name in self.adapters and not inplace:
            return 400, error(
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                f"set 'load_inplace' to True.{self.echo}",
                "InvalidUserInput",
                400,
            )
        if not (Path(path) / "adapter_config.json").exists():
            return 404, error(f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError", 404)
        self.adapters[name] = path
        self.events.append(("load", name, path))
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name):
        if name not in self.adapters:
            return 404, error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        del self.adapters[name]
        self.events.append(("unload", name))
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def sampled_with(self) -> dict[str, str]:
        """Each model name completions were asked for -> the path the server had loaded under it then."""
        loaded, used = {}, {}
        for event in self.events:
            if event[0] == "load":
                loaded[event[1]] = event[2]
            elif event[0] == "unload":
                loaded.pop(event[1])
            else:
                used.setdefault(event[1], loaded.get(event[1], "base"))
        return used


def error(message, kind, code):
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


@pytest.fixture
def fake():
    server = FakeVllm()
    yield server
    server.server.shutdown()


def make_adapter(directory: Path, weights: bytes = b"weights") -> Path:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "peft_type": "LORA"}))
    (directory / "adapter_model.safetensors").write_bytes(weights)
    return directory


def said() -> tuple[list[str], callable]:
    lines: list[str] = []
    return lines, lines.append


def test_names_differ_by_run_round_and_content_and_repeat_for_the_same(tmp_path):
    adapter = make_adapter(tmp_path / "a")
    other = make_adapter(tmp_path / "b", b"other weights")
    first, second = run_id(tmp_path / "run-1"), run_id(tmp_path / "other" / "run-1")
    names = {
        planned_adapter(adapter, first, 1).name,
        planned_adapter(adapter, second, 1).name,
        planned_adapter(adapter, first, 2).name,
        planned_adapter(other, first, 1).name,
    }
    assert len(names) == 4  # two runs with directories of one name, two rounds, two adapters
    assert planned_adapter(adapter, first, 1) == planned_adapter(adapter, run_id(tmp_path / "run-1"), 1)  # a rerun: the same
    planned = planned_adapter(adapter, first, 1)
    assert planned.name == f"{first}-r1-{adapter_sha256(adapter)[:12]}" and planned.path == str(adapter.resolve())


def test_a_directory_without_an_adapter_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AgentError, match="not a LoRA adapter directory"):
        planned_adapter(tmp_path / "empty", "run")


def test_loaded_then_listed_under_its_path_then_unloaded_at_the_end(fake, tmp_path):
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    with ServerAdapters(fake.url) as adapters:
        adapters.load(adapter)
        assert fake.adapters == {adapter.name: adapter.path}
    assert fake.adapters == {} and fake.events[-1] == ("unload", adapter.name)


def test_already_loaded_from_the_same_path_is_used_and_said(fake, tmp_path):
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    fake.load(adapter.name, adapter.path, False)  # an earlier try of this run left it
    lines, say = said()
    with ServerAdapters(fake.url, say=say) as adapters:
        adapters.load(adapter)
    assert len(lines) == 1 and "already loaded from" in lines[0] and adapter.name in lines[0]
    assert fake.adapters == {}  # this run's name: unloaded at its end


def test_already_loaded_from_another_path_is_an_error(fake, tmp_path):
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    elsewhere = make_adapter(tmp_path / "elsewhere")
    fake.load(adapter.name, str(elsewhere), False)
    with pytest.raises(AgentError) as raised, ServerAdapters(fake.url) as adapters:
        adapters.load(adapter)
    message = str(raised.value)
    assert f"already loaded from {elsewhere}, not from {adapter.path}" in message and "\n" not in message
    assert fake.adapters == {adapter.name: str(elsewhere)}  # someone else's: not unloaded


def test_a_server_that_lists_the_name_under_another_path_stops_the_run(tmp_path):
    fake = FakeVllm(lie="/somewhere/else")
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    with pytest.raises(AgentError, match="lists .* from /somewhere/else after loading it from"), ServerAdapters(fake.url) as adapters:
        adapters.load(adapter)
    fake.server.shutdown()


def test_a_path_the_server_cannot_read_is_one_line_saying_it_must_see_it(fake, tmp_path):
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1).model_copy(update={"path": str(tmp_path / "gone")})
    with pytest.raises(AgentError, match="found no adapter at .*gone.*shared filesystem"), ServerAdapters(fake.url) as adapters:
        adapters.load(adapter)


def test_a_server_without_runtime_lora_says_how_to_start_one(tmp_path):
    fake = FakeVllm(runtime_lora=False)
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    with pytest.raises(AgentError, match="--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"), ServerAdapters(fake.url) as adapters:
        adapters.load(adapter)
    fake.server.shutdown()


def test_no_server_is_one_line(tmp_path):
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    with pytest.raises(AgentError, match="no server answers at http://127.0.0.1:9/v1/load_lora_adapter"):
        ServerAdapters("http://127.0.0.1:9/v1", timeout=5).load(adapter)


def test_ctrl_c_leaves_them_loaded_and_names_them_in_one_line(fake, tmp_path):
    first, second = (planned_adapter(make_adapter(tmp_path / n, n.encode()), "run", i) for i, n in ((1, "a"), (2, "b")))
    lines, say = said()
    with pytest.raises(KeyboardInterrupt), ServerAdapters(fake.url, say=say) as adapters:
        adapters.load(first)
        adapters.load(second)
        raise KeyboardInterrupt
    assert set(fake.adapters) == {first.name, second.name}
    assert len(lines) == 1 and "2 adapter(s) were left loaded" in lines[0] and first.name in lines[0] and second.name in lines[0]


def test_an_unload_that_fails_says_what_was_left(tmp_path):
    fake = FakeVllm()
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    lines, say = said()
    with ServerAdapters(fake.url, timeout=5, say=say) as adapters:
        adapters.load(adapter)
        fake.server.shutdown()
        fake.server.server_close()  # the server is gone before the run ends
    assert len(lines) == 1 and "could not be unloaded" in lines[0] and adapter.name in lines[0]


def test_every_replica_loads_it(tmp_path):
    replicas = [FakeVllm(), FakeVllm()]
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    with ServerAdapters([r.url for r in replicas]) as adapters:
        adapters.load(adapter)
        assert all(r.adapters == {adapter.name: adapter.path} for r in replicas)
    assert all(r.adapters == {} for r in replicas)
    for replica in replicas:
        replica.server.shutdown()


def test_the_api_key_a_server_echoes_is_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123456")
    fake = FakeVllm(echo=" key sk-secret-123456")
    adapter = planned_adapter(make_adapter(tmp_path / "a"), "run", 1)
    fake.adapters[adapter.name] = "/elsewhere"
    server = ServerAdapters(fake.url)
    status, detail = server._post(server.pool.bases[0], "/load_lora_adapter", {"lora_name": adapter.name, "lora_path": adapter.path})
    assert status == 400 and "sk-secret" not in detail and "[OPENAI_API_KEY]" in detail
    fake.server.shutdown()


# -- explorer eval --policy openai --adapter ------------------------------------------------------


def eval_with_adapter(fake, tokenizer, adapter, out, *extra):
    return run_cli(
        "eval",
        "--policy",
        "openai",
        "--base-url",
        fake.url,
        "--model",
        "served",
        "--tokenizer",
        str(tokenizer),
        "--adapter",
        str(adapter),
        "--limit",
        "2",
        "--max-steps",
        "2",
        "--out",
        str(out),
        *extra,
    )


def test_eval_samples_with_the_adapter_under_its_own_name_records_it_and_unloads_it(fake, tiny_tokenizer, tmp_path):
    adapter = make_adapter(tmp_path / "adapter")
    done = eval_with_adapter(fake, tiny_tokenizer, adapter, tmp_path / "run")
    assert done.returncode == 0, done.stderr
    served = json.loads((tmp_path / "run" / "manifest.json").read_text())["config"]["policy"]["served_adapter"]
    assert served == planned_adapter(adapter, run_id(tmp_path / "run")).model_dump()
    assert fake.sampled_with() == {served["name"]: str(adapter.resolve())}  # every request named it, loaded from its path
    for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines():
        assert json.loads(line)["policy"]["settings"]["model"] == served["name"]
    assert fake.adapters == {} and fake.events[-1] == ("unload", served["name"])
    log = tmp_path / "run" / "trajectories.jsonl"
    log.write_text(log.read_text().splitlines(keepends=True)[0])  # as if killed after the first episode
    resumed = run_cli("eval", "--out", str(tmp_path / "run"), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    loads = [event for event in fake.events if event[0] == "load"]
    assert loads == [("load", served["name"], served["path"])] * 2  # the resume loads it under the recorded name
    assert fake.sampled_with() == {served["name"]: str(adapter.resolve())} and fake.adapters == {}


def test_eval_refuses_a_name_the_server_holds_for_another_path_before_writing_anything(fake, tiny_tokenizer, tmp_path):
    adapter, other = make_adapter(tmp_path / "adapter"), make_adapter(tmp_path / "other")
    planned = planned_adapter(adapter, run_id(tmp_path / "run"))
    fake.load(planned.name, str(other.resolve()), False)
    done = eval_with_adapter(fake, tiny_tokenizer, adapter, tmp_path / "run")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is already loaded from" in done.stderr and not (tmp_path / "run" / "manifest.json").exists()
    assert not any(event[0] == "complete" for event in fake.events)


def test_eval_resume_refuses_an_adapter_whose_files_changed(fake, tiny_tokenizer, tmp_path):
    adapter = make_adapter(tmp_path / "adapter")
    assert eval_with_adapter(fake, tiny_tokenizer, adapter, tmp_path / "run").returncode == 0
    (adapter / "adapter_model.safetensors").write_bytes(b"retrained")
    resumed = run_cli("eval", "--out", str(tmp_path / "run"), "--resume", "--retry-errors")
    assert resumed.returncode == 2 and "its files changed since the run began" in resumed.stderr, resumed.stderr


def test_run_with_an_openai_adapter_says_where_it_belongs(tiny_tokenizer, tmp_path):
    adapter = make_adapter(tmp_path / "adapter")
    done = run_cli(
        "run",
        "--policy",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "served",
        "--tokenizer",
        str(tiny_tokenizer),
        "--adapter",
        str(adapter),
        "--question",
        "What?",
    )
    assert done.returncode == 2 and "is for explorer eval" in done.stderr, done.stderr


def test_an_adapter_file_linked_out_of_its_directory_is_refused_not_hashed(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    outside = tmp_path / "weights.bin"
    with open(outside, "wb") as handle:
        handle.truncate(1 << 20)
    (adapter / "adapter_model.safetensors").symlink_to(outside)
    with pytest.raises(AgentError, match="symbolic link out of"):
        adapter_sha256(adapter)
