"""``explorer serve``: the typed-decision HTTP API (``decisions.service``) over one model, loaded
once, on 127.0.0.1 unless told otherwise.

The address is bound before the model loads, so a port in use is one line at once; uvicorn then
serves on that socket. Ctrl-C stops it as every command stops (exit 130), SIGTERM as a service
manager stops it (exit 0); either way the requests in flight are answered first."""

from __future__ import annotations

import errno
import importlib.util
import ipaddress
import signal
import socket
from pathlib import Path
from types import FrameType

import typer

from paper_explorer.cli.errors import UsageError


class Terminated(Exception):
    """SIGTERM, raised once uvicorn has shut down (it re-raises the signal it caught)."""


def serve_command(
    model: str = typer.Option(..., "--model", "-m", help="The model: a directory or hub id (transformers)."),
    adapter: Path | None = typer.Option(None, "--adapter", help="A LoRA adapter directory to load on the model."),
    quantization: str = typer.Option("auto", "--quantization", help="auto (4-bit on CUDA, full on CPU), 4bit or none."),
    host: str = typer.Option("127.0.0.1", "--host", help="The address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8080, "--port", min=0, max=65_535, help="The port (0: a free one, printed)."),
    max_context: int | None = typer.Option(
        None, "--max-context", min=16, help="The most tokens of prompt and option (default: the model's)."
    ),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch's CPU threads (default: half the cores)."),
    batch_tokens: int = typer.Option(65_536, "--batch-tokens", min=1, help="Cached and option positions per batched pass (bounds memory)."),
    max_questions: int = typer.Option(64, "--max-questions", min=1, help="The most questions one request may ask."),
    max_document_tokens: int = typer.Option(
        1_048_576, "--max-doc-tokens", min=1, help="The longest document a request may send, in tokens."
    ),
    max_body_mb: float = typer.Option(16.0, "--max-body-mb", min=0.001, help="The largest request body, in MiB."),
) -> None:
    """Answer typed questions about a document over HTTP: a probability for every option."""
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"explorer serve needs {' and '.join(missing)}: install the serve extra with pip install -e '.[serve]'")
    from paper_explorer.decisions.backends import LocalBackend
    from paper_explorer.decisions.service import ServeLimits, create_app, listening_socket

    try:
        listener = listening_socket(host, port)
    except socket.gaierror as error:  # a name that resolves to nothing: the port is not the problem
        raise UsageError(
            f"--host {host!r}: not an address ({error.strerror or error}); give an IP address of this machine, such as 127.0.0.1"
        ) from None
    except OSError as error:
        fix = (
            "choose another --port, or 0 for a free one"
            if error.errno == errno.EADDRINUSE
            else "give an address of this machine, such as 127.0.0.1"
        )
        raise UsageError(f"--host {host} --port {port}: cannot listen there ({error.strerror or error}); {fix}") from None
    if not ipaddress.ip_address(listener.getsockname()[0]).is_loopback:
        typer.echo(
            f"warning: listening on {host}, reachable from other machines; the API has no authentication, so anyone who can reach "
            "this port can use the model (put it behind a proxy that authenticates)",
            err=True,
        )
    with listener:
        backend = LocalBackend.load(
            model, adapter=adapter, quantization=quantization, max_context=max_context, threads=threads, batch_tokens=batch_tokens
        )
        limits = ServeLimits(body_bytes=int(max_body_mb * 2**20), document_tokens=max_document_tokens, questions=max_questions)
        bound_host, bound_port = listener.getsockname()[:2]
        url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"

        def ready() -> None:
            typer.echo(f"serving typed decisions at {url}/v1/decisions (API docs: {url}/docs); Ctrl-C stops it")

        _serve(create_app(backend, limits, on_ready=ready), listener)


def _serve(app, listener: socket.socket) -> None:
    import uvicorn

    # log_config None: uvicorn's lines go through the CLI's logging (shown with -v), not a config of its own.
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, timeout_graceful_shutdown=None))
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        server.run(sockets=[listener])
    except Terminated:
        typer.echo("stopped (SIGTERM)", err=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    # uvicorn raises a signal it shut down for again once its handlers are gone; should that not
    # reach us as KeyboardInterrupt (a second signal while it shut down, a handler another library
    # left), Ctrl-C still ends the command as every command's does: exit 130.
    if signal.SIGINT in getattr(server, "_captured_signals", []):
        raise KeyboardInterrupt


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()
