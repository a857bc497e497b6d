"""`polyspec distill`: cut a drafter from the verifier, distil the verifier into it, inspect it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from polyspec.errors import UserError

distill_app = typer.Typer(
    name="distill",
    help="Drafters cut from the verifier (its first layers, optionally a reduced vocabulary), and their training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULT_LAYERS = 4
PROMPT_LANGUAGE = "eng"  # translation prompts and their instructions are English


def register(app: typer.Typer) -> None:
    app.add_typer(distill_app, name="distill")


def verifier_or_default(verifier: str) -> str:
    from polyspec.specs import DEFAULT_VERIFIER

    return verifier or DEFAULT_VERIFIER


@distill_app.command()
def init(
    verifier: Annotated[str, typer.Option(help="Verifier: local path or hub id (default: embedded).")] = "",
    layers: Annotated[int, typer.Option(help="Decoder layers kept from the bottom of the verifier.")] = DEFAULT_LAYERS,
    vocab_top: Annotated[int, typer.Option(help="Keep the V most frequent tokens of the corpora; 0 = all.")] = 0,
    vocab_corpus: Annotated[list[Path] | None, typer.Option(help="Text file to count tokens in (repeatable).")] = None,
    vocab_language: Annotated[
        list[str] | None, typer.Option(help="Count tokens in a language's corpus split (repeatable).")
    ] = None,
    language: Annotated[
        str | None,
        typer.Option(help="Build the benchmark's draft-baseline of this language (default --out and corpora)."),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Drafter directory to write.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the drafter's record as JSON.")] = False,
) -> None:
    """The untrained drafter: the verifier's embeddings, first L layers, final norm and head."""
    from polyspec.distill.init import file_source, init_drafter, language_source
    from polyspec.distill.store import drafter_dir

    if out is None:
        if language is None:
            raise UserError("give --out DIR, or --language CODE to write the language's draft-baseline")
        out = drafter_dir(language, "baseline")
    codes = list(vocab_language or [])
    if language is not None and vocab_top and not codes and not vocab_corpus:
        codes = [language] + ([PROMPT_LANGUAGE] if language != PROMPT_LANGUAGE else [])
    sources = [file_source(path) for path in vocab_corpus or []] + [language_source(code) for code in codes]
    path, meta = init_drafter(verifier_or_default(verifier), layers, out, vocab_top, sources)
    if as_json:
        print(json.dumps({"out": str(path), **meta.to_dict()}, ensure_ascii=False))
        return
    vocab = f"{meta.kept:,} of {meta.vocab_size:,} tokens" if meta.kept else f"all {meta.vocab_size:,} tokens"
    print(f"wrote {path}: {meta.layers} of {meta.verifier_layers} layers, head over {vocab}")


@distill_app.command()
def train(
    language: Annotated[str, typer.Option(help="Language of the prompts (translation EN->X) or corpus.")],
    data: Annotated[str, typer.Option(help="translation (task-specific) | monolingual (general-domain)")],
    verifier: Annotated[str, typer.Option(help="Verifier: local path or hub id (default: embedded).")] = "",
    drafter: Annotated[Path | None, typer.Option(help="Drafter to start from (default: the draft-baseline).")] = None,
    out: Annotated[Path | None, typer.Option(help="Where to write the trained drafter.")] = None,
    loss: Annotated[str, typer.Option(help="fkl | rkl | tvd")] = "fkl",
    top_k_logits: Annotated[int, typer.Option(help="Verifier log-probs kept per position; 0 = full.")] = 20,
    on_policy: Annotated[
        bool, typer.Option(help="Train on the drafter's own samples, scored by the verifier.")
    ] = False,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 150,
    batch_size: Annotated[int, typer.Option(help="Sequences per step and process.")] = 8,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, warmup then cosine).")] = 1e-4,
    warmup: Annotated[int, typer.Option(help="Warmup steps.")] = 20,
    parallel: Annotated[Path | None, typer.Option(help="Training TSV (English<TAB>X) instead of UDHR 0-20.")] = None,
    corpus: Annotated[Path | None, typer.Option(help="Monolingual text instead of the corpus split.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens the verifier writes per translation prompt.")] = 48,
    samples: Annotated[int, typer.Option(help="Verifier outputs per prompt: 1 greedy, the rest sampled.")] = 4,
    window: Annotated[int, typer.Option(help="Tokens per monolingual window.")] = 64,
    max_prompt_tokens: Annotated[int, typer.Option(help="Leave out longer translation prompts; 0 = none.")] = 256,
    seed: Annotated[int, typer.Option(help="Seed for data order, sampling and initialisation.")] = 0,
    save_every: Annotated[int, typer.Option(help="Checkpoint every N steps.")] = 50,
    resume: Annotated[bool, typer.Option(help="Continue from the latest checkpoint in OUT.train/.")] = False,
    keep_checkpoints: Annotated[bool, typer.Option(help="Keep OUT.train/ after the drafter is written.")] = False,
    cache: Annotated[bool, typer.Option(help="Cache the verifier's outputs on disk and reuse them.")] = True,
    cache_dir: Annotated[Path | None, typer.Option(help="Where to cache them.")] = None,
    dtype: Annotated[str, typer.Option(help="Verifier dtype: auto | float32 | bfloat16 | float16")] = "auto",
    mixed_precision: Annotated[str, typer.Option(help="Drafter compute: auto | no | bf16 | fp16")] = "auto",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda (under accelerate launch: auto)")] = "auto",
    evaluate: Annotated[bool, typer.Option(help="Loss and top-1 agreement over all data before and after.")] = False,
    progress: Annotated[bool, typer.Option(help="Show progress bars on stderr.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Distil the verifier into a drafter (runs as is, or under `accelerate launch`)."""
    from polyspec.distill.checkpoint import is_drafter_dir
    from polyspec.distill.data import DataOptions
    from polyspec.distill.store import DATA_KINDS, drafter_dir
    from polyspec.distill.store import cache_dir as default_cache
    from polyspec.distill.trainer import TrainConfig
    from polyspec.distill.trainer import train as run_training

    if data not in DATA_KINDS:
        raise UserError(f"unknown data {data!r}: use {', '.join(DATA_KINDS)}")
    for path in (parallel, corpus):
        if path is not None and not path.is_file():
            raise UserError(f"file {str(path)!r} does not exist")
    drafter = drafter or drafter_dir(language, "baseline")
    if not is_drafter_dir(drafter):
        raise UserError(
            f"no drafter in {str(drafter)!r}: build one first with `polyspec distill init --language {language} "
            "--vocab-top 8192` (or give --drafter DIR)"
        )
    options = DataOptions(
        kind=data,
        language=language,
        top_k=top_k_logits,
        max_new_tokens=max_new_tokens,
        samples=samples,
        window=window,
        max_prompt_tokens=max_prompt_tokens,
        seed=seed,
        parallel=str(parallel) if parallel else None,
        corpus=str(corpus) if corpus else None,
    )
    config = TrainConfig(
        verifier=verifier_or_default(verifier),
        drafter=str(drafter),
        out=str(out or drafter_dir(language, DATA_KINDS[data])),
        data=options,
        loss=loss,
        on_policy=on_policy,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        warmup=warmup,
        seed=seed,
        teacher_dtype=dtype,
        mixed_precision=mixed_precision,
        device=device,
        save_every=save_every,
        cache_dir=str(cache_dir or default_cache()) if cache else None,
    )
    report = run_training(
        config, resume=resume, show_progress=progress, keep_checkpoints=keep_checkpoints, evaluate=evaluate
    )
    if not report.main:
        return
    if as_json:
        print(json.dumps(report.to_dict()))
        return
    print(
        f"wrote {report.out}: {report.steps} steps on {report.examples} sequences, {report.processes} process(es), "
        f"in {report.train_seconds:.0f} s "
        f"({report.seconds_per_step:.2f} s/step; verifier outputs {report.data_seconds:.0f} s"
        f"{', cached' if report.cache_hit else ''}); loss {report.loss_first:.4f} -> {report.loss_last:.4f}, "
        f"top-1 agreement {report.top1_first:.3f} -> {report.top1_last:.3f}"
    )
    if evaluate and not on_policy:  # on-policy data are prompts only: nothing fixed to evaluate on
        (loss_before, loss_after), (top1_before, top1_after) = report.eval_loss, report.eval_top1
        print(
            f"over all training data: loss {loss_before:.4f} -> {loss_after:.4f}, "
            f"top-1 agreement {top1_before:.3f} -> {top1_after:.3f}"
        )


@distill_app.command()
def info(drafter: Annotated[Path, typer.Argument(help="Drafter directory.")]) -> None:
    """Print what a drafter was built from and trained on (JSON)."""
    from polyspec.drafters.distilled import read_meta

    print(json.dumps(read_meta(drafter).to_dict(), indent=2, ensure_ascii=False))
