"""`polyspec serve`: the OpenAI-compatible server on one verifier."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from polyspec.specs import DRAFTER_HELP


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    verifier: Annotated[str, typer.Option(help="Verifier: a name, local path or hub id (default: embedded).")] = "",
    drafter: Annotated[str, typer.Option(help="Default drafter: " + DRAFTER_HELP)] = "prompt-lookup",
    gamma: Annotated[int, typer.Option(help="Draft length per verifier call (a request may set its own).")] = 3,
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")] = "auto",
    device: Annotated[str, typer.Option(help="cpu | cuda[:N] | auto")] = "cpu",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8000,
    model_name: Annotated[str, typer.Option(help="Model id clients ask for (default: the verifier's name).")] = "",
    max_tokens: Annotated[int, typer.Option(help="Tokens generated when a request names no max_tokens.")] = 256,
) -> None:
    """Serve /v1/completions and /v1/chat/completions (OpenAI-compatible, streaming), /v1/models,
    /health and /metrics. Requests run one at a time, first come first served."""
    from polyspec.decoding import check_budget
    from polyspec.errors import UserError
    from polyspec.specs import DEFAULT_VERIFIER, parse_drafter

    check_budget(gamma, max_tokens)
    parse_drafter(drafter)
    if not 0 <= port <= 65535:
        raise UserError(f"port must be between 0 and 65535, got {port}")
    try:
        import uvicorn

        from polyspec.serve.app import build_app
    except ImportError as exc:
        raise UserError(
            f"the server needs the serve extra (pip install 'polyspec[serve]'): {exc.name} is missing"
        ) from exc
    from polyspec.api import Engine

    engine = Engine(verifier or DEFAULT_VERIFIER, dtype=dtype, device=device, drafter=drafter, gamma=gamma)
    engine.drafter()  # build the default drafter now: a bad file fails before the server starts
    app = build_app(engine, model_name or None, default_max_tokens=max_tokens)
    print(f"polyspec: serving {model_name or engine.name!r} on http://{host}:{port}/v1", file=sys.stderr)
    uvicorn.run(app, host=host, port=port, log_level="warning")
