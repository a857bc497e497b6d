"""`polyspec ngram`: train, inspect, verify, convert and merge n-gram models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from polyspec.commands import options
from polyspec.errors import UserError

ngram_app = typer.Typer(
    name="ngram",
    help="Train, inspect, verify, convert and merge n-gram drafter models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

BACKOFF_CHOICES = ("longest", "none")


def register(app: typer.Typer) -> None:
    app.add_typer(ngram_app, name="ngram")


def parse_backoff(value: str) -> bool:
    if value not in BACKOFF_CHOICES:
        raise UserError(f"backoff must be one of {', '.join(BACKOFF_CHOICES)}, got {value!r}")
    return value == "longest"


def parse_ids(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; '' is the empty context."""
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise UserError(f"context ids must be comma-separated non-negative integers, got {part!r}")
        ids.append(int(part))
    return ids


@ngram_app.command()
def train(
    tokenizer: options.Tokenizer,
    out: Annotated[Path, typer.Option(help="Model file to write.")],
    corpus: options.Corpus,
    more_corpus: options.MoreCorpus = None,
    order: Annotated[int, typer.Option(help="N-gram order, 1 to 8.")] = 2,
    min_count: Annotated[int, typer.Option(help="Drop n-grams (order >= 2) seen fewer times.")] = 1,
    text_field: options.TextField = "text",
    column: options.Column = "0",
    progress: options.Progress = True,
    as_json: options.JsonReport = False,
) -> None:
    """Count n-grams of a corpus in a tokenizer's tokens (each line or record is one document)."""
    from polyspec.ngram.corpus import RecordFormat
    from polyspec.ngram.train import check_order, check_output, train_files
    from polyspec.specs import load_tokenizer

    check_order(order)
    check_output(out)
    files = options.corpus_files(corpus, more_corpus)
    report = train_files(
        load_tokenizer(tokenizer),  # imports torch: only once the arguments are known good
        files,
        order,
        out,
        min_count=min_count,
        record_format=RecordFormat(text_field=text_field, column=column),
        show_progress=progress,
        metadata={"tokenizer": tokenizer},
    )
    if as_json:
        print(json.dumps(report.to_dict()))
        return
    print(f"wrote {report.out} ({report.file_size:,} bytes) in {report.seconds:.1f} s")
    print(f"documents: {report.documents:,}  tokens: {report.tokens:,}")
    for n, count in enumerate(report.ngrams, start=1):
        print(f"{n}-grams: {count:,}")
    print(f"tokenising {report.tokenize_seconds:.1f} s, counting {report.count_seconds:.1f} s")


@ngram_app.command()
def top(
    model: Annotated[Path, typer.Option(help="N-gram model file.")],
    context_ids: Annotated[str, typer.Option(help="Context token ids, comma-separated (last order-1 used).")] = "",
    k: Annotated[int, typer.Option(help="How many candidates.")] = 5,
    backoff: Annotated[str, typer.Option(help="longest: back off to the longest seen suffix; none: exact only.")] = (
        "longest"
    ),
    as_json: options.Json = False,
) -> None:
    """The most probable next tokens after a context."""
    from polyspec.ngram import load

    use_backoff = parse_backoff(backoff)
    if k < 1:
        raise UserError(f"k must be >= 1, got {k}")
    ids = parse_ids(context_ids)
    candidates = load(model).top(ids, k, backoff=use_backoff)
    if as_json:
        print(json.dumps({"candidates": [c.to_dict() for c in candidates]}))
        return
    if not candidates:
        print("context not seen (no back-off): no candidates")
    for c in candidates:
        print(f"{c.token_id}\tprob {c.prob:.4f}\tcount {c.count}\torder {c.order}")


def stats_dict(stored) -> dict:
    ngrams = stored.ngram_counts()
    return {
        "order": stored.order,
        "vocab_size": stored.fingerprint.vocab_size,
        "vocab_sha256": stored.fingerprint.vocab_sha256,
        "ngrams_per_order": {str(n): count for n, count in enumerate(ngrams, start=1)},
        "ngrams_total": sum(ngrams),
        "tokens": stored.num_tokens,
        "documents": stored.documents,
        "min_count": stored.min_count,
        "file_size": stored.file_size,
        "bytes_per_ngram": stored.file_size / max(1, sum(ngrams)),
        "data_sha256": stored.data_sha256,
        "metadata": stored.metadata,
    }


@ngram_app.command()
def stats(
    model: Annotated[Path, typer.Argument(help="N-gram model file.")],
    as_json: options.Json = False,
) -> None:
    """What a model file holds and where its counts come from (the provenance the benchmark
    records as `drafter_source`: the file's SHA-256 and the text it was trained on)."""
    from polyspec.bench.provenance import ngram_source
    from polyspec.ngram.storage import load

    info = stats_dict(load(model))
    info["source"] = ngram_source(model)
    if as_json:
        print(json.dumps(info))
        return
    print(f"order {info['order']}, vocabulary {info['vocab_size']:,} tokens")
    print(f"trained on {info['tokens']:,} tokens in {info['documents']:,} documents (min count {info['min_count']})")
    for n, count in info["ngrams_per_order"].items():
        print(f"{n}-grams: {count:,}")
    print(f"file size {info['file_size']:,} bytes ({info['bytes_per_ngram']:.2f} bytes per n-gram)")
    print(f"file sha256 {info['source']['sha256']}")
    if not info["metadata"].get("text_sha256"):
        print("text sha256: unrecorded (a file written before models recorded it)")
    metadata = dict(info["metadata"])
    for source in metadata.pop("corpus", []):
        print(f"corpus {source['file']} ({source['bytes']:,} bytes, sha256 {source['sha256']})")
    for key, value in sorted(metadata.items()):
        print(f"{key}: {json.dumps(value) if isinstance(value, dict | list) else value}")


@ngram_app.command()
def verify(model: Annotated[Path, typer.Argument(help="N-gram model file.")]) -> None:
    """Read the whole file against the hash of its data written with it (loading checks only the header)."""
    from polyspec.ngram.storage import verify as check

    stored = check(model)
    print(f"{model}: ok ({stored.file_size:,} bytes, data sha256 {stored.data_sha256})")


@ngram_app.command()
def convert(
    old: Annotated[Path, typer.Argument(help="Model file of format version 1.")],
    out: Annotated[Path, typer.Option(help="Model file to write in the current format.")],
) -> None:
    """Rewrite a model file of an older format in the current one (same counts)."""
    from polyspec.ngram.storage import convert as rewrite
    from polyspec.ngram.train import check_output

    check_output(out)
    print(f"wrote {out} ({rewrite(old, out).file_size:,} bytes)")


@ngram_app.command()
def merge(
    models: Annotated[list[Path], typer.Argument(help="Model files to merge (same tokenizer and order).")],
    out: Annotated[Path, typer.Option(help="Merged model file to write.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the merged model's stats as JSON.")] = False,
) -> None:
    """Add the counts of several models into one."""
    from polyspec.ngram.merging import merge_files

    info = stats_dict(merge_files(models, out))
    if as_json:
        print(json.dumps(info))
        return
    print(f"wrote {out} ({info['file_size']:,} bytes): {info['tokens']:,} tokens, {info['ngrams_total']:,} n-grams")
