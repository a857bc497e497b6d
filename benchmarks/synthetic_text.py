"""Text for the n-gram and suffix benchmarks: the sentences shipped in dataset-build, and more
sentences like them, sampled from per-language word-bigram chains fitted to that text."""

from __future__ import annotations

import importlib.util
import random
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path


def source_lines() -> dict[str, list[str]]:
    """Non-empty lines of the text shipped in dataset-build, by language directory."""
    spec = importlib.util.find_spec("dataset_build")  # locate only: the package itself is not imported
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the dataset-build package is not installed")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    lines: dict[str, list[str]] = defaultdict(list)
    for path in sorted(data.rglob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines[path.parent.name].extend(line.strip() for line in text.split("\n") if line.strip())
    return dict(lines)


def sampler(by_language: dict[str, list[str]], rng: random.Random) -> Callable[[], str]:
    """A source of sentences, each from one language's word-bigram chain, drawn with `rng`."""
    chains = []
    for language in sorted(by_language):
        following: dict[str, list[str]] = defaultdict(list)
        starts = [line.split()[0] for line in by_language[language]]
        lengths = [len(line.split()) for line in by_language[language]]
        for line in by_language[language]:
            words = line.split()
            for a, b in zip(words, words[1:], strict=False):
                following[a].append(b)
        chains.append((starts, lengths, following))

    def sentence() -> str:
        starts, lengths, following = rng.choice(chains)
        words = [rng.choice(starts)]
        for _ in range(rng.choice(lengths) - 1):
            if not following.get(words[-1]):
                break
            words.append(rng.choice(following[words[-1]]))
        return " ".join(words)

    return sentence


def corpus_documents(megabytes: float, seed: int = 0) -> list[str]:
    """The real text once, then sampled sentences up to `megabytes` (UTF-8, one per line)."""
    by_language = source_lines()
    documents = [line for lines in by_language.values() for line in lines]
    size, sentence = sum(len(d.encode()) + 1 for d in documents), sampler(by_language, random.Random(seed))
    while size < megabytes * 1e6:
        documents.append(sentence())
        size += len(documents[-1].encode()) + 1
    return documents
