"""The `polyspec` command line. User errors print one line on stderr and exit with code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from polyspec.commands import options
from polyspec.errors import UserError
from polyspec.specs import DRAFTER_HELP

app = typer.Typer(
    name="polyspec",
    help="Lossless speculative decoding that pays off in every language.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Lossless speculative decoding that pays off in every language."""


@app.command()
def generate(
    verifier: Annotated[str, typer.Option(help="Verifier: local path or hub id (default: embedded).")] = "",
    drafter: Annotated[str, typer.Option(help=DRAFTER_HELP)] = "none",
    gamma: Annotated[int, typer.Option(help="Draft length per verifier call.")] = 3,
    tree: Annotated[
        int,
        typer.Option(
            help="Verify token trees of up to N nodes and gamma levels (N >= gamma; 0 = chains); "
            "an adaptive drafter sizes each tree, up to N nodes, by expected tokens per second."
        ),
    ] = 0,
    prompt: Annotated[str | None, typer.Option(help="Prompt text.")] = None,
    prompt_file: Annotated[Path | None, typer.Option(help="Read the prompt from this file.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="0 = off.")] = 0,
    top_p: Annotated[float, typer.Option(help="1 = off.")] = 1.0,
    repetition_penalty: Annotated[float, typer.Option(help="1 = off.")] = 1.0,
    penalty_window: Annotated[int, typer.Option(help="Tokens the repetition penalty looks back; 0 = all.")] = 0,
    stop: Annotated[list[str] | None, typer.Option(help="Stop string (repeatable).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed for sampling.")] = 0,
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")] = "auto",
    device: Annotated[str, typer.Option(help="cpu | cuda[:N] | auto")] = "cpu",
    as_json: options.Json = False,
) -> None:
    """Generate from a verifier, speculatively with a drafter."""
    from polyspec.decoding import Decoder, check_budget, check_tree
    from polyspec.sampling import SamplingConfig
    from polyspec.specs import load_model, make_drafter, parse_drafter

    text = read_prompt(prompt, prompt_file)
    sampling = SamplingConfig(temperature, top_k, top_p, repetition_penalty, penalty_window)
    check_budget(gamma, max_new_tokens)
    check_tree(tree, gamma)
    parse_drafter(drafter)
    model = load_model(verifier, dtype=dtype, device=device)
    decoder = Decoder(model)
    decoder.check_tree_support(tree)  # before a drafter is built (an adaptive one measures the verifier)
    prompt_ids = decoder.encode(text)
    result = decoder.generate(
        prompt_ids,
        make_drafter(drafter, model),
        gamma=gamma,
        sampling=sampling,
        max_new_tokens=max_new_tokens,
        stop_strings=stop or (),
        seed=seed,
        tree=tree,
    )
    if as_json:
        stats = result.stats.to_dict()
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "stats": stats}, ensure_ascii=False))
        return
    from rich.console import Console

    console = Console(stderr=True)
    print(result.text)
    s = result.stats
    console.print(
        f"[dim]{s.new_tokens} tokens in {s.seconds:.2f} s ({s.tokens_per_second:.1f} tok/s), "
        f"acceptance {s.acceptance_rate:.2f} ({s.accepted}/{s.drafted}), "
        f"{s.tokens_per_call:.2f} tokens per verifier call ({s.nodes_verified / max(s.verifier_calls, 1):.1f} "
        f"positions each), stop: {result.stop_reason}[/dim]"
    )


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if (prompt is None) == (prompt_file is None):
        raise UserError("give exactly one of --prompt or --prompt-file")
    if prompt_file is not None:
        try:
            prompt = prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read prompt file {str(prompt_file)!r}: {exc.__class__.__name__}") from exc
    if not prompt or not prompt.strip():
        raise UserError("the prompt is empty")
    return prompt


def _register_subcommands() -> None:
    """Command groups live next to the code they drive."""
    import importlib

    modules = ("commands.ngram", "commands.suffix", "assets.cli", "bench.cli", "distill.cli", "serve.cli")
    for module_name in (f"polyspec.{name}" for name in modules):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        module.register(app)
    from polyspec.commands import ngram_distill

    ngram_distill.register(app)


_register_subcommands()


def quiet_transformers() -> None:
    """Keep stderr for our own messages: no weight-loading bars or library warnings."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def main() -> None:
    try:
        quiet_transformers()
        app(standalone_mode=False)
    except UserError as exc:
        print(f"polyspec: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("polyspec: interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.Abort:
        sys.exit(130)
    except Exception as exc:
        # Usage errors arrive here with standalone_mode=False, as click's exceptions or as those of
        # the copy of click that typer vendors: both format their own message.
        if not callable(getattr(exc, "format_message", None)):
            raise
        print(f"polyspec: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))


if __name__ == "__main__":  # python -m polyspec.cli
    main()
