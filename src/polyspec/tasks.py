"""Benchmark prompts for each language and task, built from splits that never overlap.

Splits of the UDHR, by article number (article 0 is the preamble):
- corpus, the training text of n-gram drafters and distillation: the preamble and articles
  1-20, plus the language's dataset-build text when it has some;
- held out: articles 21-30, the evaluation items and the few-shot examples. A prompt's
  examples never come from the article its own item belongs to.
A user `corpus` file replaces the corpus split and a user `parallel` TSV the held-out split.
Whatever the source, `corpus_text` drops every corpus paragraph that contains held-out text or
is contained in it, so n-gram statistics never see an evaluation reference or example.

Tasks (each prompt carries the stop strings that end its answer):
- translation: EN->X few-shot, the reference kept for chrF. A base model tends to copy its
  examples rather than translate, so the examples are few (1 by default) and short, from
  another article than the item, each line says its language, and the source comes last;
- story: "Write a story in {language} about a(n) {adjective noun}", as in the study, followed
  by an opening in the language ("One day,") so that a base model goes on in that language;
- continuation: the opening of a held-out paragraph, continued by the model: a monolingual
  control with no English in the prompt.
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from polyspec.assets.languages import Language, get_language
from polyspec.errors import UserError

CORPUS_ARTICLES = range(0, 21)
HELD_OUT_ARTICLES = range(21, 31)
SOURCE_CODE = "eng"
TASKS = ("translation", "story", "continuation")
DEFAULT_SHOTS = 1
# Examples are drawn from the shortest held-out items: short examples leave the model less to
# copy and keep prompts short.
SHOT_POOL = 6
# Continuation prompts show this share of the paragraph (at least a few words or characters).
OPENING_SHARE = 0.4

STORY_TOPICS = (
    "brave lion", "old fisherman", "lost key", "curious child", "empty house", "angry river",
    "honest merchant", "quiet village", "hungry dog", "red bicycle", "orange cat", "broken drum",
    "clever tortoise", "tall mountain", "young teacher", "secret garden", "kind stranger",
    "small boat", "wise grandmother", "stolen goat", "golden bird", "long journey", "new school",
    "strange dream", "shy elephant", "busy market", "ancient tree", "heavy storm", "missing letter",
    "generous king",
)  # fmt: skip


@dataclass(frozen=True)
class Prompt:
    language: str
    task: str
    item: str  # stable id of what the prompt asks about: "udhr:25.1", "tsv:12", "story:brave-lion"
    text: str
    reference: str | None  # what a good answer looks like (None for stories)
    stop_strings: tuple[str, ...]
    source: str | None = None  # the English source of a translation item


@dataclass(frozen=True)
class HeldOut:
    group: str  # items of the same group (UDHR article) never serve as each other's examples
    item: str
    source: str | None  # English
    target: str


# ---------------------------------------------------------------- splits


def held_out(language: str | Language) -> list[HeldOut]:
    """The evaluation split: aligned (English, language) items, in a fixed order."""
    language = get_language(language)
    if language.parallel is not None:
        return [
            HeldOut(f"tsv:{line}", f"tsv:{line}", source, target)
            for line, source, target in read_parallel(language.parallel)
        ]
    if language.udhr_code is None:
        raise UserError(f"language {language.code!r} has no parallel file and no UDHR code: no held-out text")
    from polyspec.assets.udhr import align, read_declaration

    source = read_declaration(SOURCE_CODE)
    target = read_declaration(language.udhr_code)
    return [
        HeldOut(f"udhr:{pair.article}", f"udhr:{pair.item}", pair.source, pair.target)
        for pair in align(source, target, HELD_OUT_ARTICLES)
    ]


def corpus_text(language: str | Language) -> list[str]:
    """The training split, one paragraph per entry; never contains held-out text."""
    language = get_language(language)
    if language.corpus is not None:
        paragraphs = read_lines(language.corpus)
    elif language.udhr_code is not None:
        from polyspec.assets.udhr import read_declaration

        paragraphs = read_declaration(language.udhr_code).paragraphs(CORPUS_ARTICLES)
        paragraphs += _dataset_build_paragraphs(language)
    else:
        raise UserError(f"language {language.code!r} has no corpus file and no UDHR code: no training text")
    has_held_out = language.parallel is not None or language.udhr_code is not None
    if not has_held_out:
        return paragraphs
    texts = [text for item in held_out(language) for text in (item.source, item.target) if text]
    return remove_overlaps(paragraphs, texts)


def _dataset_build_paragraphs(language: Language) -> list[str]:
    if language.dataset_build is None:
        return []
    from polyspec.assets.store import dataset_build_text

    path = dataset_build_text(language.dataset_build)
    if path is None:
        return []
    return read_lines(path)


def remove_overlaps(paragraphs: list[str], held_out_texts: Sequence[str], min_chars: int = 20) -> list[str]:
    """Drop paragraphs that contain a held-out text, or (when at least `min_chars` long) are
    contained in one; comparison ignores case, Unicode form and runs of whitespace."""
    held = [text for text in map(_normal, held_out_texts) if text]
    normals = [_normal(paragraph) for paragraph in paragraphs]
    # One substring search per held-out text over the whole corpus finds the few that occur,
    # so large corpora are not scanned once per held-out text.
    joined_corpus, joined_held = "\x00".join(normals), "\x00".join(held)
    found = [text for text in held if text in joined_corpus]
    kept = []
    for paragraph, normal in zip(paragraphs, normals, strict=True):
        if len(normal) >= min_chars and normal in joined_held:
            continue
        if any(text in normal for text in found):
            continue
        kept.append(paragraph)
    return kept


def _normal(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).casefold().split())


# ---------------------------------------------------------------- user files


def read_lines(path: Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file, stripped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {str(path)!r}: {exc.__class__.__name__}") from exc
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_parallel(path: Path) -> list[tuple[int, str, str]]:
    """(line number, source, reference) rows of a two-column TSV; a 'source<TAB>reference'
    header line is allowed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {str(path)!r}: {exc.__class__.__name__}") from exc
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) != 2 or not columns[0].strip() or not columns[1].strip():
            raise UserError(f"{path}:{number}: expected 'source<TAB>reference', got {len(columns)} column(s)")
        if number == 1 and [c.strip().lower() for c in columns] == ["source", "reference"]:
            continue
        rows.append((number, columns[0].strip(), columns[1].strip()))
    if not rows:
        raise UserError(f"{path}: no rows")
    return rows


# ---------------------------------------------------------------- prompts


def build_prompts(
    language: str | Language,
    task: str,
    limit: int | None = None,
    seed: int = 0,
    shots: int = DEFAULT_SHOTS,
) -> list[Prompt]:
    """Up to `limit` prompts (all by default) for one language and task.

    `seed` fixes which items are picked and which examples they get. Items are ordered by their
    ids before shuffling, so languages aligned with English get the same items for one seed.
    """
    language = get_language(language)
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}: use {', '.join(TASKS)}")
    if limit is not None and limit < 1:
        raise UserError(f"limit must be >= 1, got {limit}")
    if task == "story":
        return story_prompts(language, limit, seed)
    items = held_out(language)
    order = sorted(items, key=lambda item: item.item)
    random.Random(seed).shuffle(order)
    if task == "translation":
        return translation_prompts(language, items, order[:limit], seed, shots)
    prompts = [prompt for item in order if (prompt := continuation_prompt(language, item))]
    return prompts[:limit]


def translation_prompts(
    language: Language, pool: list[HeldOut], chosen: list[HeldOut], seed: int, shots: int
) -> list[Prompt]:
    if language.code == SOURCE_CODE:
        raise UserError("translation is from English: pick a language other than English")
    if shots < 0:
        raise UserError(f"shots must be >= 0, got {shots}")
    return [translation_prompt(language, item, pick_shots(pool, item, shots, seed)) for item in chosen]


def pick_shots(pool: list[HeldOut], item: HeldOut, shots: int, seed: int) -> list[HeldOut]:
    """`shots` short examples from other groups than the item's, chosen by seed and item."""
    others = [other for other in pool if other.group != item.group and other.source]
    if shots > len(others):
        raise UserError(f"{shots} examples asked for, but only {len(others)} held-out items can serve")
    others.sort(key=lambda other: (len(other.source) + len(other.target), other.item))
    shortest = others[: max(SHOT_POOL, shots)]
    return random.Random(f"{seed}:{item.item}").sample(shortest, shots)


def translation_prompt(language: Language, item: HeldOut, shots: Sequence[HeldOut]) -> Prompt:
    lines = [f"Translate from English to {language.name}.", ""]
    for shot in shots:
        lines += [f"English: {shot.source}", f"{language.name}: {shot.target}", ""]
    lines += [f"English: {item.source}", f"{language.name}:"]
    return Prompt(language.code, "translation", item.item, "\n".join(lines), item.target, ("\n",), item.source)


def story_prompts(language: Language, limit: int | None, seed: int) -> list[Prompt]:
    topics = list(STORY_TOPICS)
    random.Random(seed).shuffle(topics)
    return [story_prompt(language, topic) for topic in topics[:limit]]


def story_prompt(language: Language, topic: str) -> Prompt:
    article = "an" if topic[0] in "aeiou" else "a"
    text = f"Write a story in {language.name} about {article} {topic}.\n\n"
    if language.story_lead:
        text += language.story_lead
    else:
        text += f"{language.name}:\n"
    return Prompt(language.code, "story", f"story:{topic.replace(' ', '-')}", text, None, ("\n\n",))


def continuation_prompt(language: Language, item: HeldOut) -> Prompt | None:
    """The opening of the item's text; None when it is too short to cut."""
    cut = opening_length(item.target, language.spaced)
    if cut is None:
        return None
    opening, rest = item.target[:cut].rstrip(), item.target[cut:].strip()
    return Prompt(language.code, "continuation", item.item, opening, rest, ("\n",))


def opening_length(text: str, spaced: bool) -> int | None:
    """Where to cut `text`: after OPENING_SHARE of its words (characters when unspaced)."""
    if spaced:
        starts = [i for i, ch in enumerate(text) if ch == " " and i > 0 and text[i - 1] != " "]
        if len(starts) < 5:  # fewer than 6 words
            return None
        words = max(3, round((len(starts) + 1) * OPENING_SHARE))
        return starts[words - 1]
    if len(text) < 20:
        return None
    return max(8, round(len(text) * OPENING_SHARE))


def cut_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """The answer part of a generation: everything before the first stop string."""
    positions = [text.find(stop) for stop in stop_strings if stop and stop in text]
    return text[: min(positions)] if positions else text


# ---------------------------------------------------------------- output checks


def _ngrams(ids: Sequence[int], n: int) -> list[tuple[int, ...]]:
    ids = list(ids)
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def copy_n(output_ids: Sequence[int], prompt_ids: Sequence[int], n: int) -> float:
    """Share of the output's n-grams that occur in the prompt (0.0 when the output has none)."""
    output = _ngrams(output_ids, n)
    if not output:
        return 0.0
    prompt = set(_ngrams(prompt_ids, n))
    return sum(gram in prompt for gram in output) / len(output)


def copy4(output_ids: Sequence[int], prompt_ids: Sequence[int]) -> float:
    """Share of output 4-grams found in the prompt: high means the model copied its examples."""
    return copy_n(output_ids, prompt_ids, 4)


def distinct_n(ids: Sequence[int], n: int) -> float:
    """Distinct n-grams over all n-grams (0.0 when there are none): low means loops."""
    grams = _ngrams(ids, n)
    return len(set(grams)) / len(grams) if grams else 0.0


def distinct2(ids: Sequence[int]) -> float:
    return distinct_n(ids, 2)
