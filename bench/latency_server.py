"""An OpenAI-compatible test server that answers every completion after a fixed latency.

    python bench/latency_server.py --port 8100 --latency 0.2 --im-start 151644

It stands in for a served model in bench/concurrency.py: ``POST /v1/completions`` waits
``--latency`` seconds (asyncio: thousands of requests wait at once at almost no cost), then
answers a scripted action: a search on the first step of an episode, a submit on the next. The
step is read from the prompt's token ids (the number of ``<|im_start|>`` tokens), so the server
keeps no state per episode. ``GET /v1/models`` lists the model; ``GET /stats`` returns the
arrival time of each completion request (monotonic seconds), from which the bench measures
throughput. HTTP/1.1 with keep-alive, as vLLM serves it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time

SEARCH = '```python\nhits = search("learning rate batch size")\nprint(hits[:2])\n```'
SUBMIT = '```python\nsubmit("3e-5", evidence=[])\n```'


class LatencyServer:
    def __init__(self, latency: float, im_start: int, model: str) -> None:
        self.latency, self.model = latency, model
        self.turn = re.compile(rb"[\[ ,]%d(?=[,\] ])" % im_start)
        self.arrivals: list[float] = []

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if method == "GET" and path == "/stats":
            return 200, {"arrivals": self.arrivals}
        if method == "POST" and path == "/v1/completions":
            self.arrivals.append(time.monotonic())
            turns = len(self.turn.findall(body))  # system, user, then 2 per step, then the generation prompt
            text = SEARCH if turns <= 3 else SUBMIT
            return 200, {
                "object": "text_completion",
                "model": self.model,
                "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                "usage": {"completion_tokens": 20},
            }
        return 404, {"error": f"no {method} {path}"}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                if method == "POST":
                    await asyncio.sleep(self.latency)
                status, answer = self.answer(method, path, body)
                data = json.dumps(answer).encode()
                writer.write(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (status, len(data)) + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


async def main(port: int, latency: float, im_start: int, model: str) -> None:
    server = LatencyServer(latency, im_start, model)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", port, backlog=4096, limit=1 << 24)
    print(f"listening on {listener.sockets[0].getsockname()[1]}", flush=True)
    async with listener:
        await listener.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--im-start", type=int, required=True, help="The tokenizer's id of <|im_start|>.")
    parser.add_argument("--model", default="policy")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.port, arguments.latency, arguments.im_start, arguments.model))
