"""Command-line options that several commands share, written once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Tokenizer = Annotated[str, typer.Option(help="Tokenizer: a tokenizer or model directory, a hub id, or an asset.")]
Corpus = Annotated[list[Path], typer.Option(help="Corpus files or directories: .txt, .jsonl, .tsv, .gz of these.")]
MoreCorpus = Annotated[
    list[Path] | None, typer.Argument(help="More corpus paths.", metavar="CORPUS", show_default=False)
]
TextField = Annotated[str, typer.Option(help="JSONL field holding the text.")]
Column = Annotated[str, typer.Option(help="TSV column: 0-based number, or a name from the header line.")]
Progress = Annotated[bool, typer.Option(help="Show a progress bar on stderr.")]
JsonReport = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def corpus_files(corpus: list[Path], more_corpus: list[Path] | None) -> list[Path]:
    """The files of the corpus paths (directories expanded), checked before any work starts."""
    from polyspec.ngram.corpus import corpus_files as expand

    return expand([*corpus, *(more_corpus or [])])
