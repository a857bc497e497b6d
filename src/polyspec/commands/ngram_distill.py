"""`polyspec ngram distill`: an n-gram trained on text the verifier itself samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from polyspec.commands import options
from polyspec.errors import UserError


def distill(
    language: Annotated[str, typer.Option(help="Language code (see `polyspec assets languages`).")],
    out: Annotated[Path, typer.Option(help="Model file to write; samples are kept beside it (OUT.samples/).")],
    verifier: Annotated[str, typer.Option(help="Verifier that writes the corpus (default: embedded).")] = "",
    order: Annotated[int, typer.Option(help="N-gram order, 1 to 8.")] = 3,
    tokens: Annotated[int, typer.Option(help="Tokens the verifier samples (docs/NGRAM.md: how many pay).")] = 72_000,
    batch: Annotated[int, typer.Option(help="Samples per batch.")] = 10,
    sample_tokens: Annotated[int, typer.Option(help="Tokens per sample.")] = 64,
    prompts: Annotated[Path | None, typer.Option(help="More seed prompts: a text file, one per line.")] = None,
    corpus: Annotated[Path | None, typer.Option(help="The language's corpus file (replaces its split).")] = None,
    mix: Annotated[list[Path] | None, typer.Option(help="Real corpus files to mix in (counts add up).")] = None,
    mix_weight: Annotated[int, typer.Option(help="How many times the verifier's samples count against --mix.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the prompt order and of sampling.")] = 0,
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")] = "auto",
    device: Annotated[
        str, typer.Option(help="Where the verifier samples: cpu | cuda[:N] | auto (counting is on the CPU).")
    ] = "cpu",
    threads: Annotated[int, typer.Option(help="CPU threads for torch (0: its default, all cores).")] = 0,
    progress: options.Progress = True,
    as_json: options.JsonReport = False,
) -> None:
    """Sample a corpus from the verifier in LANGUAGE (resumable) and train an n-gram on it."""
    from polyspec.assets.languages import get_language, with_files
    from polyspec.ngram.corpus import RecordFormat, corpus_files, read_documents
    from polyspec.ngram.train import check_order, check_output
    from polyspec.ngram_distill import SelfCorpusSettings, distill_ngram
    from polyspec.specs import DEFAULT_VERIFIER, load_model

    checks = (("tokens", tokens), ("batch", batch), ("sample tokens", sample_tokens), ("mix weight", mix_weight))
    for name, value in checks:
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if threads < 0:
        raise UserError(f"threads must be >= 0, got {threads}")
    check_order(order)
    check_output(out)
    device = resolve_device(device)  # before anything is read or loaded
    target = with_files(get_language(language), corpus=corpus) if corpus else get_language(language)
    extra = _read_lines(prompts) if prompts else None
    mixed = None
    if mix:
        mixed = [
            doc for path in corpus_files(list(mix)) for docs in read_documents(path, RecordFormat()) for doc in docs
        ]
    if threads:
        import torch

        torch.set_num_threads(threads)
    model = load_model(verifier, dtype=dtype, device=device)
    settings = SelfCorpusSettings(tokens=tokens, batch=batch, sample_tokens=sample_tokens, seed=seed)
    recorded = {"distilled_from": verifier or DEFAULT_VERIFIER, "verifier_fingerprint": _fingerprint(model)}
    with _bar(progress, tokens) as advance:
        report = distill_ngram(
            model, target, order, out, settings, extra, mixed, mix_weight, on_progress=advance, metadata=recorded
        )
    if as_json:
        print(json.dumps(report.to_dict(), ensure_ascii=False))
    else:
        print(f"wrote {out}: order {order}, {report.tokens} tokens counted (sampled on {model.device.type})")


def resolve_device(device: str) -> str:
    """cpu, cuda, cuda:N, or auto (cuda where there is one); a device that is not there is one
    error line, before the verifier is loaded."""
    import torch

    kind, colon, index = device.partition(":")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if kind != "cuda" or (colon and not index.isdigit()):
        raise UserError(f"unknown device {device!r}: use cpu, cuda, cuda:N or auto")
    if not torch.cuda.is_available():
        raise UserError(f"device {device!r} requested but no CUDA device is available: use --device cpu")
    if colon and int(index) >= torch.cuda.device_count():
        raise UserError(f"device {device!r} requested but there are {torch.cuda.device_count()} CUDA devices")
    return device


def _fingerprint(model) -> str:
    from polyspec.bench.provenance import model_fingerprint

    return model_fingerprint(model.model, model.dtype_name)


def _read_lines(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read prompts file {str(path)!r}: {exc.__class__.__name__}") from exc


def _bar(enabled: bool, total: int):
    import contextlib

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    if not enabled:
        return contextlib.nullcontext(lambda done: None)

    @contextlib.contextmanager
    def bar():
        columns = (TextColumn("verifier samples"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=Console(stderr=True)) as shown:
            task = shown.add_task("sampling", total=total)
            yield lambda done: shown.update(task, completed=done)

    return bar()


def register(app: typer.Typer) -> None:
    """Adds `distill` to the `ngram` command group."""
    group = next(info.typer_instance for info in app.registered_groups if info.name == "ngram")
    group.command("distill")(distill)
