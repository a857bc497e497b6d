"""N-grams distilled from the verifier: the verifier writes its own corpus, an n-gram counts it.

A corpus n-gram knows what people wrote; a drafter needs to know what the verifier will write.
So the verifier samples continuations of seed prompts in the language (with the study's sampling
settings by default) and an n-gram is trained on those samples, optionally mixed with a real
corpus. Seed prompts never touch what the benchmark evaluates:
- stories on topics the benchmark's story prompts do not use (`DISTILL_TOPICS`);
- continuations of openings of the language's corpus-split paragraphs;
- translations of the corpus split's English paragraphs, where the split is aligned (UDHR).

Each sampled position also keeps the verifier's `keep_top` most probable tokens there, with
their probabilities after the sampling settings (the distribution it drew from; free: sampling
computes it anyway). The n-gram counts those as fractions of an occurrence besides the token
drawn, so a context seen once already holds the verifier's whole distribution there instead of
one draw from it (soft counts, as a distilled neural drafter learns from the teacher's
probabilities rather than from its samples).

Samples are appended to shards (one JSON line per sample, fsynced), so an interrupted run
resumes where it stopped; the prompt order and every batch's seed are fixed by `seed`, so a
resumed run writes what an uninterrupted one would have.

The verifier samples on its own device (`LoadedModel.device`: a GPU works as the CPU does, one
transfer of the drawn ids and one of the top candidates per step); counting runs on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from polyspec.errors import UserError
from polyspec.files import append_lines, drop_torn_line, read_lines
from polyspec.models import LoadedModel
from polyspec.ngram.counting import count_rows
from polyspec.ngram.trie import Trie, scaled
from polyspec.sampling import STUDY_SAMPLING, LogitsProcessor, SamplingConfig
from polyspec.vocabulary import fingerprint

# None of these is a topic of the benchmark's story prompts (polyspec.tasks.STORY_TOPICS).
DISTILL_TOPICS = (
    "patient farmer", "noisy rooster", "silver river", "lazy crocodile", "young hunter",
    "forgotten song", "clay pot", "rainy season", "proud peacock", "little sister",
    "night market", "lonely star", "green field", "travelling singer", "lucky coin",
    "stubborn donkey", "open door", "cold morning", "friendly monkey", "first harvest",
    "village well", "wooden flute", "hidden cave", "dancing girl",
)  # fmt: skip


# Changes whenever `sample_batch` draws differently from the same seed, so that caches keyed by
# the settings notice: 1 drew row by row, 2 draws every row of a step in one call, 3 also keeps
# the verifier's top candidates at every position, 4 draws among the tokens a row can give.
SAMPLER_VERSION = 4

# What one sampled position weighs in the counts, about: the token drawn counts once and its top
# candidates share the rest by probability, each rounded (one below 1 / (2 (SAMPLE_UNIT - 1))
# rounds away).
SAMPLE_UNIT = 32

# Where a row can give more than this share of the vocabulary, it is drawn from the whole of it:
# a top-k over that many tokens would cost more than the multinomial it saves.
_SPARSE_SHARE = 1 / 8


@dataclass(frozen=True)
class SelfCorpusSettings:
    tokens: int = 72_000  # to generate (docs/NGRAM.md: acceptance against generation time, the 10-minute bound)
    batch: int = 10
    sample_tokens: int = 64  # per sample
    seed: int = 0
    keep_top: int = 8  # the verifier's candidates kept at each position, for soft counts
    sampling: SamplingConfig = field(default_factory=lambda: STUDY_SAMPLING)


def seed_prompts(language, extra: list[str] | None = None) -> list[tuple[str, str]]:
    """(kind, text) seed prompts for `language` (a `polyspec.assets.languages.Language`)."""
    from polyspec.tasks import OPENING_SHARE, corpus_text, story_prompt

    prompts = [("story", story_prompt(language, topic).text) for topic in DISTILL_TOPICS]
    for paragraph in corpus_text(language):
        cut = max(8, int(len(paragraph) * OPENING_SHARE))
        if len(paragraph) > cut + 8:
            prompts.append(("continuation", paragraph[:cut].rstrip()))
    prompts += [("translation", text) for text in _translation_prompts(language)]
    prompts += [("user", text) for text in extra or []]
    return prompts


def _translation_prompts(language) -> list[str]:
    if language.udhr_code is None or language.corpus is not None:
        return []
    from polyspec.assets.udhr import align, read_declaration
    from polyspec.tasks import CORPUS_ARTICLES, SOURCE_CODE

    pairs = align(read_declaration(SOURCE_CODE), read_declaration(language.udhr_code), CORPUS_ARTICLES)
    return [f"English: {pair.source}\n{language.name}:" for pair in pairs if pair.source]


class Shards:
    """Append-only JSON lines of samples under `directory`; a torn last line is cut off."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "samples.jsonl"

    def read(self) -> list[dict]:
        """The complete samples; a line an interruption cut short is cut off the file, so that
        what is appended next follows the last complete sample."""
        if not self.path.exists():
            return []
        drop_torn_line(self.path)
        return read_lines(self.path, "sample log")

    def append(self, samples: list[dict]) -> None:
        append_lines(self.path, samples)


@dataclass
class Sampled:
    ids: list[int] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)  # per position, most probable first
    top_probs: list[list[float]] = field(default_factory=list)


@torch.inference_mode()
def sample_batch(
    verifier: LoadedModel, prompts: list[list[int]], settings: SelfCorpusSettings, seed: int, eos: frozenset[int]
) -> list[Sampled]:
    """Sample `settings.sample_tokens` tokens after each prompt, in one left-padded batch, with
    the verifier's `settings.keep_top` most probable tokens at every position."""
    from transformers import DynamicCache

    device = verifier.device
    width = max(map(len, prompts))
    pad = verifier.tokenizer.pad_token_id or 0
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    processor = LogitsProcessor(settings.sampling)
    generator = torch.Generator(device=device).manual_seed(seed)
    histories = [list(p) for p in prompts]
    outputs = [Sampled() for _ in prompts]
    done = [False] * len(prompts)
    cache = DynamicCache(config=verifier.model.config)
    step_ids = input_ids
    for _ in range(settings.sample_tokens):
        positions = (mask.cumsum(-1) - 1).clamp_min(0)[:, -step_ids.shape[1] :]
        logits = verifier.model(
            input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]  # fmt: skip
        # Every row after its own history (the repetition penalty's context), drawn in one call
        # on the verifier's device; per step, a few small transfers (the support's size, the
        # drawn ids, the top candidates).
        probs = processor.probs_after(logits, (), histories)
        drawn, top_ids, top_probs = draw_with_candidates(probs, settings.keep_top, generator)
        rows = zip(drawn.tolist(), top_ids.tolist(), top_probs.tolist(), strict=True)
        for row, (token, candidates, candidate_probs) in enumerate(rows):
            if not done[row]:
                histories[row].append(token)
                out = outputs[row]
                out.ids.append(token)
                kept = [(c, round(p, 4)) for c, p in zip(candidates, candidate_probs, strict=True) if p >= 1e-4]
                out.top_ids.append([c for c, _ in kept])
                out.top_probs.append([p for _, p in kept])
                done[row] = token in eos
        if all(done):
            break
        step_ids = drawn[:, None]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return outputs


def draw_with_candidates(
    probs: torch.Tensor, keep_top: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row of `probs` ([n, V]), and each row's `keep_top` most probable tokens
    with their probabilities, most probable first. Where every row gives few tokens (top-k leaves
    50 of 262k) the draw is among the best `support` of them, which holds every token a row can
    give, so it is exact, and 4.3 ms per step of 10 rows instead of 61 ms for a multinomial over
    the whole vocabulary (2 CPU cores)."""
    vocab = probs.shape[-1]
    support = int((probs > 0).sum(dim=-1).max())
    if support > vocab * _SPARSE_SHARE:
        top_probs, top_ids = probs.topk(min(keep_top, vocab), dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0], top_ids, top_probs
    values, index = probs.topk(max(support, min(keep_top, vocab)), dim=-1)
    drawn = index.gather(-1, torch.multinomial(values, 1, generator=generator))[:, 0]
    return drawn, index[:, :keep_top], values[:, :keep_top]


def generate_corpus(
    verifier: LoadedModel, language, work: Path, settings: SelfCorpusSettings, extra_prompts: list[str] | None = None
) -> Iterator[int]:
    """Extends the samples under `work` until they hold `settings.tokens` tokens; yields the
    number of tokens after each batch (resuming from what is there)."""
    prompts = seed_prompts(language, extra_prompts)
    order = list(range(len(prompts)))
    random.Random(settings.seed).shuffle(order)
    shards = Shards(work)
    done = shards.read()
    total = sum(len(s["ids"]) for s in done)
    batch_index = len(done) // settings.batch
    eos = eos_ids(verifier)
    yield total
    while total < settings.tokens:
        picks = [order[(batch_index * settings.batch + i) % len(order)] for i in range(settings.batch)]
        ids = [_encode(verifier, prompts[i][1]) for i in picks]
        began, cpu_began = time.perf_counter(), time.process_time()
        outputs = sample_batch(verifier, ids, settings, settings.seed * 1_000_003 + batch_index, eos)
        # Each sample's share of its batch's wall-clock and CPU time (all threads of this
        # process), so that the log says what N tokens cost, also on a shared machine.
        share = (time.perf_counter() - began) / len(picks)
        cpu_share = (time.process_time() - cpu_began) / len(picks)
        samples = [
            {
                "prompt": i,
                "kind": prompts[i][0],
                "ids": out.ids,
                "top_ids": out.top_ids,
                "top_probs": out.top_probs,
                "seconds": round(share, 4),
                "cpu_seconds": round(cpu_share, 4),
            }
            for i, out in zip(picks, outputs, strict=True)
        ]
        shards.append(samples)
        total += sum(len(out.ids) for out in outputs)
        batch_index += 1
        yield total


def _encode(verifier: LoadedModel, text: str) -> list[int]:
    return verifier.tokenizer(text)["input_ids"]


def eos_ids(verifier: LoadedModel) -> frozenset[int]:
    """The verifier's stop tokens: a sample ends before the first."""
    ids = verifier.model.generation_config.eos_token_id
    if ids is None:
        ids = verifier.tokenizer.eos_token_id
    return frozenset([] if ids is None else ids if isinstance(ids, list) else [ids])


def prompts_fingerprint(prompts: list[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode("utf-8")).hexdigest()


def distill_ngram(
    verifier: LoadedModel,
    language,
    order: int,
    out: Path,
    settings: SelfCorpusSettings,
    extra_prompts: list[str] | None = None,
    mix: list[str] | None = None,
    mix_weight: int = 1,
    on_progress=None,
    metadata: dict | None = None,
    corpus_weight: int = 1,
    samples_dir: Path | None = None,
):
    """Generate (or resume) the verifier's corpus in `samples_dir` (default: OUT.samples/ next to
    `out`) and train the n-gram on it.

    With `mix` (documents of a real corpus), counts add up: the verifier's samples count
    `mix_weight` times each, the real documents `corpus_weight` times. The model file's metadata records the
    verifier, the language, the seed prompts (how many of each kind, and a SHA-256 of them all),
    the settings, the sampler version and the tokens sampled; `metadata` adds entries to it (or
    replaces them: e.g. `distilled_from` with the name the verifier was given by, or a
    fingerprint of its weights)."""
    from polyspec.ngram.train import train

    if order < 1:
        raise UserError(f"order must be >= 1, got {order}")
    if mix_weight < 1 or corpus_weight < 0:
        raise UserError(f"the samples must weigh >= 1 and the corpus >= 0, got {mix_weight} and {corpus_weight}")
    work = samples_dir or out.with_name(out.name + ".samples")
    for total in generate_corpus(verifier, language, work, settings, extra_prompts):
        if on_progress is not None:
            on_progress(min(total, settings.tokens))
    samples = Shards(work).read()
    vocab_size = fingerprint(verifier.tokenizer).vocab_size
    counted = scaled(sample_counts(samples, order, vocab_size, eos_ids(verifier)), mix_weight)
    prompts = seed_prompts(language, extra_prompts)
    kinds: dict[str, int] = {}
    for kind, _ in prompts:
        kinds[kind] = kinds.get(kind, 0) + 1
    recorded = {
        "distilled_from": verifier.name,
        "verifier_dtype": verifier.dtype_name,
        "verifier_device": verifier.device.type,
        "language": language.code,
        "sampled_tokens": str(sum(len(s["ids"]) for s in samples)),
        "samples": str(len(samples)),
        "samples_sha256": samples_fingerprint(samples),
        "sample_unit": str(SAMPLE_UNIT),
        "seed_prompts": str(len(prompts)),
        "seed_prompt_kinds": json.dumps(kinds, sort_keys=True),
        "seed_prompts_sha256": prompts_fingerprint(prompts),
        "settings": json.dumps({**asdict(settings), "sampling": asdict(settings.sampling)}),
        "sampler_version": str(SAMPLER_VERSION),
        "mix_documents": str(len(mix or [])),
        "mix_weight": str(mix_weight),
        "mix_corpus_weight": str(corpus_weight),
        **(metadata or {}),
    }
    # A real document's n-gram weighs `corpus_weight` sampled tokens (at 0, it is left out).
    return train(
        verifier.tokenizer, (mix or []) if corpus_weight else [], order=order, out=out, show_progress=False,
        metadata=recorded, weight=max(1, corpus_weight) * SAMPLE_UNIT, counted=counted,
    )  # fmt: skip


def sample_counts(samples: list[dict], order: int, vocab_size: int, stop: frozenset[int]) -> Trie:
    """The samples' n-grams, each position weighing SAMPLE_UNIT: the token drawn once, the
    verifier's kept candidates the rest in proportion to their probabilities (all of it to the
    token drawn in a log that kept none). A sample ends before a stop token or an id outside
    the vocabulary, and neither is counted as a candidate."""
    rows, weights, counted = [], [], 0
    for sample in samples:
        ids = sample["ids"]
        end = next((i for i, t in enumerate(ids) if t in stop or t >= vocab_size), len(ids))
        counted += end
        padded = [-1] * (order - 1) + ids[:end]
        kept = "top_ids" in sample
        top_ids, top_probs = (sample["top_ids"], sample["top_probs"]) if kept else ([[]] * end, [[]] * end)
        for i in range(end):
            context = padded[i : i + order - 1]
            rows.append([*context, ids[i]])
            weights.append(1 if kept else SAMPLE_UNIT)
            for token, prob in zip(top_ids[i], top_probs[i], strict=True):
                if (weight := round(prob * (SAMPLE_UNIT - 1))) and token < vocab_size and token not in stop:
                    rows.append([*context, token])
                    weights.append(weight)
    trie = count_rows(np.array(rows, dtype=np.int64).reshape(-1, order), np.array(weights, dtype=np.int64), vocab_size)
    trie.documents, trie.num_tokens = len(samples), counted
    return trie


def samples_fingerprint(samples: list[dict]) -> str:
    fields = [[s["ids"], s.get("top_ids"), s.get("top_probs")] for s in samples]
    return hashlib.sha256(json.dumps(fields).encode("utf-8")).hexdigest()
