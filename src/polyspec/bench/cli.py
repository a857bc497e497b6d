"""`polyspec bench` and `polyspec report`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polyspec.errors import UserError


def parse_files(values: list[str] | None) -> dict[str, Path]:
    """LANG=FILE pairs."""
    files = {}
    for value in values or []:
        code, sep, path = value.partition("=")
        if not sep or not code or not path:
            raise UserError(f"expected LANG=FILE, got {value!r}")
        files[code] = Path(path).expanduser()
    return files


def bench(
    preset: Annotated[
        str,
        typer.Option(
            help="quick (a few minutes), full (the study's languages), ngram-distill (n-grams distilled from the "
            "verifier against corpus n-grams) or study (its Qwen3.5 setup, GPU)."
        ),
    ] = "quick",
    languages: Annotated[str | None, typer.Option(help="Comma-separated codes, e.g. amh,npi,zh.")] = None,
    tasks: Annotated[str | None, typer.Option(help="translation,story,continuation")] = None,
    drafters: Annotated[
        str | None,
        typer.Option(
            help="none,ngram-bigram,ngram,ngram+context,prompt-lookup,hf-prompt-lookup,adaptive (the default), "
            "ngram-distill,ngram-distill+context,adaptive-distill (opt-in: minutes per language to build) "
            "or drafter specs"
        ),
    ] = None,
    gammas: Annotated[str | None, typer.Option(help="Draft lengths, e.g. 2,3,5.")] = None,
    modes: Annotated[str | None, typer.Option(help="greedy,sample")] = None,
    limit: Annotated[int | None, typer.Option(help="Prompts per language and task.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Tokens per generation.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for prompt choice and sampling.")] = None,
    verifier: Annotated[str | None, typer.Option(help="Verifier path or hub id (default: embedded).")] = None,
    dtype: Annotated[str | None, typer.Option(help="auto | float32 | bfloat16 | float16")] = None,
    device: Annotated[str | None, typer.Option(help="cpu | cuda[:N]")] = None,
    distill_tokens: Annotated[
        int | None,
        typer.Option(help="Tokens the verifier samples per ngram-distill model (default: as `polyspec ngram distill`)"),
    ] = None,
    corpus: Annotated[list[str] | None, typer.Option(help="LANG=FILE: training text for a language.")] = None,
    parallel: Annotated[list[str] | None, typer.Option(help="LANG=FILE: TSV of source, reference.")] = None,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("runs/bench"),
    resume: Annotated[bool, typer.Option(help="Continue the results in --out.")] = False,
    shard: Annotated[str | None, typer.Option(help="I/N: run the I-th of N slices of the grid.")] = None,
    recipe: Annotated[str | None, typer.Option(help="study: the preset of the study's full-scale setup.")] = None,
    dry_run: Annotated[bool, typer.Option(help="The preset's models shrunk and random, one draft per run.")] = False,
    report: Annotated[bool, typer.Option(help="Write the report when done.")] = True,
) -> None:
    """Benchmark drafters across languages and tasks; results go to OUT/results.jsonl."""
    from polyspec.bench.grid import RECIPES, parse_list, parse_shard
    from polyspec.bench.grid import preset as make_preset

    if recipe is not None:
        if recipe not in RECIPES:
            raise UserError(f"unknown recipe {recipe!r}: use {', '.join(RECIPES)}")
        preset = recipe
    config = make_preset(
        preset,
        languages=parse_list(languages),
        tasks=parse_list(tasks),
        drafters=parse_list(drafters),
        gammas=parse_list(gammas, int),
        modes=parse_list(modes),
        limit=limit,
        max_new_tokens=max_new_tokens,
        seed=seed,
        verifier=verifier,
        dtype=dtype,
        device=device,
        shard=parse_shard(shard) if shard else None,
        corpora=parse_files(corpus) or None,
        parallels=parse_files(parallel) or None,
        distill_tokens=distill_tokens,
    )
    from polyspec.tasks import TASKS

    for task in config.tasks:
        if task not in TASKS:
            raise UserError(f"unknown task {task!r}: use {', '.join(TASKS)}")
    from polyspec.bench.runner import run_bench

    try:
        results = run_bench(config, out, resume, dry_run=dry_run)
    except KeyboardInterrupt:
        # Every finished record is already on disk, whole: say how to go on, exit as Ctrl-C does.
        typer.echo(
            f"polyspec: interrupted; {out / 'results.jsonl'} holds every finished record: add --resume", err=True
        )
        raise SystemExit(130) from None
    typer.echo(f"results: {results}", err=True)
    if report:
        from polyspec.bench.report import write_report

        path = write_report([results], out)
        typer.echo(f"report: {path}", err=True)


def report_command(
    results: Annotated[list[Path], typer.Argument(help="One or more results.jsonl files.")],
    out: Annotated[Path, typer.Option(help="Directory for report.md, results.csv and plots.")] = Path("runs/report"),
) -> None:
    """Tables, CSV and plots from benchmark results."""
    from polyspec.bench.report import write_report

    path = write_report(results, out)
    typer.echo(f"report: {path}", err=True)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("report")(report_command)
