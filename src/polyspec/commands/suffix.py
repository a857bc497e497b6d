"""`polyspec suffix`: build a suffix index of a corpus and show what an index holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from polyspec.commands import options

suffix_app = typer.Typer(
    name="suffix",
    help="Build and inspect suffix indexes for the longest-match drafter (suffix:PATH).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def register(app: typer.Typer) -> None:
    app.add_typer(suffix_app, name="suffix")


@suffix_app.command()
def build(
    tokenizer: options.Tokenizer,
    out: Annotated[Path, typer.Option(help="Index file to write.")],
    corpus: options.Corpus,
    more_corpus: options.MoreCorpus = None,
    text_field: options.TextField = "text",
    column: options.Column = "0",
    progress: options.Progress = True,
    as_json: options.JsonReport = False,
) -> None:
    """Index a corpus in a tokenizer's tokens (each line or record is one document)."""
    from polyspec.ngram.corpus import RecordFormat
    from polyspec.ngram.train import check_output
    from polyspec.specs import load_tokenizer
    from polyspec.suffix.build import build_files

    check_output(out)
    files = options.corpus_files(corpus, more_corpus)
    report = build_files(
        load_tokenizer(tokenizer),  # imports torch: only once the arguments are known good
        files,
        out,
        record_format=RecordFormat(text_field=text_field, column=column),
        show_progress=progress,
        metadata={"tokenizer": tokenizer},
    )
    if as_json:
        print(json.dumps(report.to_dict()))
        return
    print(f"wrote {report.out} ({report.file_size:,} bytes) in {report.seconds:.1f} s")
    print(f"documents: {report.documents:,}  tokens: {report.tokens:,}")
    print(f"tokenising {report.tokenize_seconds:.1f} s, suffix array {report.sort_seconds:.1f} s")


@suffix_app.command()
def stats(
    index: Annotated[Path, typer.Argument(help="Suffix index file.")],
    as_json: options.Json = False,
) -> None:
    """What an index file holds and where its text comes from."""
    from polyspec.suffix.storage import FORMAT_VERSION, load

    loaded = load(index)
    info = {
        "format_version": FORMAT_VERSION,
        "vocab_size": loaded.fingerprint.vocab_size,
        "vocab_sha256": loaded.fingerprint.vocab_sha256,
        "tokens": loaded.num_tokens,
        "documents": loaded.documents,
        "file_size": loaded.file_size,
        "bytes_per_token": loaded.file_size / max(1, loaded.num_tokens),
        "metadata": loaded.metadata,
    }
    if as_json:
        print(json.dumps(info))
        return
    print(f"suffix index, format version {info['format_version']}, vocabulary {info['vocab_size']:,} tokens")
    print(f"{info['tokens']:,} tokens in {info['documents']:,} documents")
    print(f"file size {info['file_size']:,} bytes ({info['bytes_per_token']:.2f} bytes per token)")
    metadata = dict(info["metadata"])
    for source in metadata.pop("corpus", []):
        print(f"corpus {source['file']} ({source['bytes']:,} bytes, sha256 {source['sha256']})")
    for key, value in sorted(metadata.items()):
        print(f"{key}: {json.dumps(value) if isinstance(value, dict | list) else value}")
