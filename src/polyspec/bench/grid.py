"""What a benchmark run covers: the grid of languages x tasks x prompts x modes x drafters x gammas.

A *unit* is one prompt in one mode; all drafters and gammas of a unit run back to back, with
plain decoding before (the baseline of every record) and after (the `none` record: plain
against plain, i.e. the timing noise). Units are what `--shard I/N` splits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from polyspec.assets.languages import STUDY_CODES
from polyspec.distill.store import BENCH_NAMES
from polyspec.errors import UserError
from polyspec.specs import DEFAULT_VERIFIER, parse_drafter

DEFAULT_DRAFTERS = (
    "none", "ngram-bigram", "ngram", "ngram+context", "prompt-lookup", "hf-prompt-lookup", "adaptive",
)  # fmt: skip
# What each router routes among (specs' `adaptive:SPEC;SPEC;...` over this language's drafters);
# it drafts token trees (runner.TREE_BUDGET nodes, runner.TREE_DEPTH deep) once the router can branch.
ROUTERS = {
    "adaptive": ("ngram", "ngram+context", "prompt-lookup"),
    "adaptive-distill": ("ngram-distill", "ngram-distill+context", "ngram+context", "prompt-lookup"),
}
# Opt-in: n-grams distilled from the verifier's own samples cost minutes per language to build
# (once; cached). `--drafters ...,ngram-distill,ngram-distill+context` or `--preset ngram-distill`.
OPT_IN_DRAFTERS = ("ngram-distill", "ngram-distill+context", "adaptive-distill")
BENCH_DRAFTERS = DEFAULT_DRAFTERS + OPT_IN_DRAFTERS
MODES = ("greedy", "sample")


@dataclass(frozen=True)
class BenchConfig:
    languages: tuple[str, ...]
    tasks: tuple[str, ...] = ("translation", "story", "continuation")
    drafters: tuple[str, ...] = DEFAULT_DRAFTERS
    gammas: tuple[int, ...] = (3,)
    modes: tuple[str, ...] = ("greedy",)
    limit: int = 2
    max_new_tokens: int = 48
    seed: int = 0
    verifier: str = DEFAULT_VERIFIER
    dtype: str = "auto"
    device: str = "cpu"
    shard: tuple[int, int] = (1, 1)
    ngram_order: int = 4  # of the `ngram` and `ngram+context` drafters (the study's bigram is 2)
    corpora: dict[str, Path] = field(default_factory=dict)  # language -> user corpus file
    parallels: dict[str, Path] = field(default_factory=dict)  # language -> user parallel TSV
    distill_tokens: int = 72_000  # the verifier samples this many tokens per distilled n-gram

    def __post_init__(self) -> None:
        if not self.languages:
            raise UserError("no languages to benchmark")
        for name in self.drafters:
            if name not in BENCH_DRAFTERS and name not in BENCH_NAMES:
                parse_drafter(name)  # the user's own drafter spec: checked before anything loads
        for gamma in self.gammas:
            if gamma < 1:
                raise UserError(f"gammas must be >= 1, got {gamma}")
        for mode in self.modes:
            if mode not in MODES:
                raise UserError(f"unknown mode {mode!r}: use {', '.join(MODES)}")
        if self.limit < 1:
            raise UserError(f"limit must be >= 1, got {self.limit}")
        if self.distill_tokens < 1:
            raise UserError(f"distill tokens must be >= 1, got {self.distill_tokens}")
        if self.max_new_tokens < 1:
            raise UserError(f"max new tokens must be >= 1, got {self.max_new_tokens}")
        index, count = self.shard
        if not 1 <= index <= count:
            raise UserError(f"shard must be I/N with 1 <= I <= N, got {index}/{count}")


PRESETS = {
    # Three languages with different scripts, two tasks, greedy: a few minutes on a laptop CPU.
    "quick": BenchConfig(languages=("npi", "yor", "zh"), tasks=("translation", "continuation"), limit=1),
    # The study's 12 languages and English, all tasks, both modes; one prompt per language and
    # task keeps it under an hour on two CPU cores (raise --limit for tighter intervals).
    "full": BenchConfig(
        languages=("amh", "ber", "chr", "grn", "haw", "ibo", "npi", "oci", "que", "yor", "zgh", "zh", "eng"),
        modes=("greedy", "sample"),
        limit=1,
    ),
    # The quick preset's languages, both modes, with the n-grams distilled from the verifier
    # (about 72,000 sampled tokens per language, built once and cached) against the corpus ones.
    "ngram-distill": BenchConfig(
        languages=("npi", "yor", "zh"),
        tasks=("translation", "continuation"),
        drafters=(
            "none",
            "ngram",
            "ngram+context",
            "ngram-distill",
            "ngram-distill+context",
            "adaptive",
            "adaptive-distill",
        ),
        modes=("greedy", "sample"),
        limit=1,
    ),
    # The study's full-scale run (a GPU): Qwen3.5-9B verified, Qwen3.5-0.8B drafting, gamma 2-5,
    # greedy and the study's sampling, two story prompts in each of the 12 languages.
    "study": BenchConfig(
        languages=STUDY_CODES,
        tasks=("story",),
        drafters=("none", "model:Qwen/Qwen3.5-0.8B"),
        gammas=(2, 3, 4, 5),
        modes=("greedy", "sample"),
        max_new_tokens=128,
        verifier="Qwen/Qwen3.5-9B",
        dtype="bfloat16",
        device="auto",
    ),
}
RECIPES = ("study",)  # presets that bring their own models: `--recipe NAME`, also as a `--dry-run`


def preset(name: str, **overrides) -> BenchConfig:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}: use {', '.join(PRESETS)}")
    return replace(PRESETS[name], **{key: value for key, value in overrides.items() if value is not None})


def parse_shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    try:
        if not sep:
            raise ValueError
        return int(index), int(count)
    except ValueError as exc:
        raise UserError(f"shard must look like I/N (e.g. 2/8), got {text!r}") from exc


def parse_list(text: str | None, kind=str) -> tuple | None:
    if text is None:
        return None
    try:
        return tuple(kind(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise UserError(f"cannot read {text!r} as a comma-separated list") from exc


def record_key(record: dict) -> tuple:
    """What identifies a record, for --resume."""
    return tuple(record[k] for k in ("language", "task", "item", "mode", "drafter", "gamma", "seed"))
