"""Training data for distillation: token sequences and what the verifier says about them.

Two kinds, both from the training split only (never the benchmark's held-out text):
- translation (task-specific): the benchmark's EN->X prompt format over parallel training
  pairs (UDHR articles 0-20 aligned with English, or a user TSV), continued by the verifier
  for `max_new_tokens` tokens — once greedily and `samples - 1` times with the study's
  sampling — exactly as long as the benchmark's generations;
- monolingual (general-domain): windows of the language's corpus text, each starting with BOS.

For each trained position the verifier's top-k log-probabilities are kept (`top_k` 0: none
stored, the trainer asks the verifier for full distributions as it goes). Everything is cached
in one safetensors file per setting, keyed by the verifier's content and the data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from polyspec.errors import UserError
from polyspec.files import atomic_path

DATA_KINDS = ("translation", "monolingual")
FORMAT = 1
ProgressFn = Callable[[int], None]


@dataclass(frozen=True)
class DataOptions:
    kind: str
    language: str
    top_k: int = 20
    max_new_tokens: int = 48  # the benchmark's default generation length
    samples: int = 4  # generations per translation prompt: one greedy, the rest sampled
    window: int = 64  # tokens per monolingual window, BOS included
    shots: int = 1  # few-shot examples per translation prompt, as in the benchmark
    max_prompt_tokens: int = 256  # longer translation prompts are left out; 0: no limit
    seed: int = 0
    parallel: str | None = None  # training TSV replacing the UDHR pairs
    corpus: str | None = None  # monolingual text replacing the language's corpus split
    prompts_only: bool = False  # on-policy: the drafter writes the continuations

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise UserError(f"unknown data {self.kind!r}: use {', '.join(DATA_KINDS)}")
        lows = {"top_k": 0, "max_new_tokens": 1, "samples": 1, "window": 4, "shots": 1, "max_prompt_tokens": 0}
        for name, low in lows.items():
            if getattr(self, name) < low:
                raise UserError(f"{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")


@dataclass
class TeacherData:
    """sequences[i]: token ids. Positions starts[i] .. len - 2 are trained (position t predicts
    token t + 1). On-policy generation continues sequences[i][:prompt_lengths[i]].
    target_ids / target_logprobs[i]: [len - 1 - starts[i], k] the verifier's top-k, or None."""

    sequences: list[list[int]]
    starts: list[int]
    prompt_lengths: list[int]
    target_ids: list[torch.Tensor] | None = None
    target_logprobs: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.sequences)

    def positions(self, i: int) -> int:
        return len(self.sequences[i]) - 1 - self.starts[i]


# ---------------------------------------------------------------- sources


def translation_items(language, parallel: str | None) -> list:
    """Aligned (English, language) training items, disjoint from the held-out split."""
    from polyspec.tasks import CORPUS_ARTICLES, SOURCE_CODE, HeldOut, held_out, read_parallel, remove_overlaps

    if language.code == SOURCE_CODE:
        raise UserError("translation is from English: pick a language other than English")
    if parallel is not None:
        items = [HeldOut(f"tsv:{n}", f"tsv:{n}", s, t) for n, s, t in read_parallel(Path(parallel))]
    elif language.udhr_code is not None:
        from polyspec.assets.udhr import align, read_declaration

        pairs = align(read_declaration("eng"), read_declaration(language.udhr_code), CORPUS_ARTICLES)
        items = [HeldOut(f"udhr:{p.article}", f"udhr:{p.item}", p.source, p.target) for p in pairs]
    else:
        raise UserError(f"language {language.code!r} has no UDHR text: give training pairs with --parallel FILE")
    try:
        evaluation = [text for item in held_out(language) for text in (item.source, item.target) if text]
    except UserError:
        evaluation = []
    targets = set(remove_overlaps([item.target for item in items], evaluation))
    sources = set(remove_overlaps([item.source for item in items], evaluation))
    items = [item for item in items if item.target in targets and item.source in sources]
    if len({item.group for item in items}) < 2:
        raise UserError(f"language {language.code!r}: fewer than 2 training pairs left outside the held-out split")
    return items


def translation_prompts(language, items: Sequence, shots: int, seed: int) -> list[str]:
    """The benchmark's prompt for each training item, its examples from other training items."""
    from polyspec.tasks import pick_shots, translation_prompt

    return [translation_prompt(language, item, pick_shots(list(items), item, shots, seed)).text for item in items]


def translation_prompt_ids(tokenizer, language, options: DataOptions) -> list[list[int]]:
    """The encoded training prompts, without those over `max_prompt_tokens` (a few UDHR items
    join many paragraphs: padding a batch to them would multiply the cost of every step)."""
    items = translation_items(language, options.parallel)
    prompts = [
        tokenizer(text)["input_ids"] for text in translation_prompts(language, items, options.shots, options.seed)
    ]
    limit = options.max_prompt_tokens
    kept = [ids for ids in prompts if not limit or len(ids) <= limit]
    if not kept:
        raise UserError(f"every training prompt is longer than {limit} tokens: raise --max-prompt-tokens")
    return kept


def monolingual_paragraphs(language, corpus: str | None) -> list[str]:
    from polyspec.tasks import corpus_text, read_lines

    paragraphs = read_lines(Path(corpus)) if corpus is not None else corpus_text(language)
    if not paragraphs:
        raise UserError(f"language {language.code!r} has no corpus text to distil on")
    return paragraphs


def bos_prefix(tokenizer) -> list[int]:
    """[BOS] when the tokenizer starts its encodings with it (Gemma needs it), else []."""
    bos = tokenizer.bos_token_id
    return [bos] if bos is not None and tokenizer("a")["input_ids"][:1] == [bos] else []


def windows(tokenizer, paragraphs: Sequence[str], window: int) -> list[list[int]]:
    """The paragraphs as one token stream (newline-separated) cut into BOS-led windows; a last
    window shorter than half is dropped."""
    prefix = bos_prefix(tokenizer)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    stream: list[int] = []
    for ids in tokenizer(list(paragraphs), add_special_tokens=False)["input_ids"]:
        stream += ids + newline
    body = window - len(prefix)
    cut = [stream[i : i + body] for i in range(0, len(stream), body)]
    return [prefix + part for part in cut if len(part) >= max(2, body // 2)]


# ---------------------------------------------------------------- the verifier's view


def output_rows(model, hidden: torch.Tensor, top_k: int, chunk: int = 256):
    """Top-k (ids [N, k] int32, log-probs [N, k]) of the model's distributions at `hidden`
    [N, h], or the full log-probabilities [N, V] when top_k is 0; computed in chunks so that
    [N, V] logits never all exist at once unless asked for."""
    from polyspec.distill.build import output_logits

    ids, values = [], []
    for part in hidden.split(chunk):
        logprobs = torch.log_softmax(output_logits(model, part).float(), dim=-1)
        if top_k:
            top = logprobs.topk(top_k, dim=-1)
            ids.append(top.indices.int())
            values.append(top.values)
        else:
            values.append(logprobs)
    return (torch.cat(ids), torch.cat(values)) if top_k else torch.cat(values)


def pack(sequences: Sequence[Sequence[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] and attention mask [B, T]."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids.to(device), mask.to(device)


def trained_positions(sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of every trained position of a right-padded batch, in order."""
    rows, cols = [], []
    for row, (seq, start) in enumerate(zip(sequences, starts, strict=True)):
        count = len(seq) - 1 - start
        rows += [row] * count
        cols += range(start, start + count)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)


@torch.inference_mode()
def score(model, sequences, starts, top_k: int, pad: int):
    """The model's distributions at the trained positions of `sequences`, concatenated in order."""
    from polyspec.distill.build import decoder_body

    device = next(model.parameters()).device
    ids, mask = pack(sequences, pad, device)
    rows, cols = trained_positions(sequences, starts)
    hidden = decoder_body(model)(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    return output_rows(model, hidden[rows.to(device), cols.to(device)], top_k)


@torch.inference_mode()
def continue_batch(
    model, prompts: Sequence[Sequence[int]], new_tokens: int, pad: int, sampling: dict | None, top_k: int
):
    """Continue each prompt by exactly `new_tokens` tokens (batched, left-padded). `sampling`:
    transformers' sampling settings, None for greedy. Returns the continuations and, when
    top_k > 0, the model's top-k (ids, log-probs) at each generated position, [B, n, k]."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.as_tensor(list(prompt))
        mask[row, width - len(prompt) :] = 1
    kwargs = {"do_sample": True, **sampling} if sampling else {"do_sample": False, "top_k": None, "top_p": None}
    out = model.generate(
        ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # no early end: the benchmark generates a fixed length
        pad_token_id=pad,
        output_logits=top_k > 0,
        return_dict_in_generate=True,
        **kwargs,
    )
    continuations = out.sequences[:, width:].tolist()
    if not top_k:
        return continuations, None
    tops = [torch.log_softmax(step.float(), dim=-1).topk(top_k, dim=-1) for step in out.logits]
    top_ids = torch.stack([t.indices for t in tops], dim=1).int().cpu()
    top_values = torch.stack([t.values for t in tops], dim=1).cpu()
    return continuations, (top_ids, top_values)


def study_sampling() -> dict:
    from polyspec.sampling import STUDY_SAMPLING as s

    return {
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "repetition_penalty": s.repetition_penalty,
    }


# ---------------------------------------------------------------- building and caching


def build(verifier, options: DataOptions, batch_size: int = 8, progress: ProgressFn | None = None) -> TeacherData:
    """Sequences and verifier targets for `options` (no cache)."""
    from polyspec.assets.languages import get_language

    language = get_language(options.language)
    tokenizer = verifier.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    advance = progress or (lambda n: None)
    if options.kind == "translation":
        prompts = translation_prompt_ids(tokenizer, language, options)
        if options.prompts_only:
            return TeacherData(prompts, [len(p) - 1 for p in prompts], [len(p) for p in prompts])
        return _translation_targets(verifier.model, prompts, options, pad, batch_size, advance)
    cut = windows(tokenizer, monolingual_paragraphs(language, options.corpus), options.window)
    if not cut:
        raise UserError(f"language {language.code!r}: the corpus is too short for one {options.window}-token window")
    data = TeacherData(cut, [0] * len(cut), [max(1, len(w) // 2) for w in cut])
    if options.prompts_only or not options.top_k:
        return data
    data.target_ids, data.target_logprobs = [], []
    for begin in range(0, len(cut), batch_size):
        batch = cut[begin : begin + batch_size]
        top_ids, top_values = score(verifier.model, batch, [0] * len(batch), options.top_k, pad)
        offset = 0
        for seq in batch:
            count = len(seq) - 1
            data.target_ids.append(top_ids[offset : offset + count].cpu())
            data.target_logprobs.append(top_values[offset : offset + count].cpu())
            offset += count
        advance(len(batch))
    return data


def _translation_targets(model, prompts, options: DataOptions, pad: int, batch_size: int, advance) -> TeacherData:
    data = TeacherData([], [], [], [] if options.top_k else None, [] if options.top_k else None)
    for sample in range(options.samples):
        sampling = None if sample == 0 else study_sampling()
        for begin in range(0, len(prompts), batch_size):
            batch = prompts[begin : begin + batch_size]
            torch.manual_seed(options.seed * 1_000_003 + sample * 10_007 + begin)
            continuations, tops = continue_batch(model, batch, options.max_new_tokens, pad, sampling, options.top_k)
            for row, (prompt, continuation) in enumerate(zip(batch, continuations, strict=True)):
                data.sequences.append(list(prompt) + continuation)
                data.starts.append(len(prompt) - 1)
                data.prompt_lengths.append(len(prompt))
                if tops is not None:
                    data.target_ids.append(tops[0][row])
                    data.target_logprobs.append(tops[1][row])
            advance(len(batch))
    return data


def work_units(verifier, options: DataOptions) -> int:
    """How many progress units `build` reports (sequences generated or scored)."""
    from polyspec.assets.languages import get_language

    language = get_language(options.language)
    if options.prompts_only:
        return 0
    if options.kind == "translation":
        return len(translation_prompt_ids(verifier.tokenizer, language, options)) * options.samples
    if not options.top_k:
        return 0
    return len(windows(verifier.tokenizer, monolingual_paragraphs(language, options.corpus), options.window))


def model_fingerprint(model) -> str:
    """Content hash of a model: its config and a sample of its weights (cheap, not exhaustive)."""
    digest = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for _, tensor in sorted(model.state_dict().items())[:8]:
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return digest.hexdigest()


def cache_key(verifier, options: DataOptions) -> str:
    from polyspec.assets.languages import get_language
    from polyspec.tasks import corpus_text

    language = get_language(options.language)
    fields = {"format": FORMAT, "model": model_fingerprint(verifier.model), **asdict(options)}
    # The text itself, so that a changed corpus or user file never reuses stale targets.
    for name in ("parallel", "corpus"):
        if fields[name] is not None:
            fields[name] = hashlib.sha256(Path(fields[name]).read_bytes()).hexdigest()
    if options.kind == "monolingual" and options.corpus is None:
        fields["text"] = hashlib.sha256("\n".join(corpus_text(language)).encode()).hexdigest()
    if options.kind == "translation" and options.parallel is None:
        items = translation_items(language, None)
        fields["text"] = hashlib.sha256(repr([(i.source, i.target) for i in items]).encode()).hexdigest()
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]


def save(data: TeacherData, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    lengths = [len(s) for s in data.sequences]
    tensors = {
        "tokens": torch.tensor([t for s in data.sequences for t in s], dtype=torch.long),
        "lengths": torch.tensor(lengths, dtype=torch.long),
        "starts": torch.tensor(data.starts, dtype=torch.long),
        "prompt_lengths": torch.tensor(data.prompt_lengths, dtype=torch.long),
    }
    if data.target_ids is not None:
        tensors["target_ids"] = torch.cat(data.target_ids).contiguous()
        tensors["target_logprobs"] = torch.cat(data.target_logprobs).float().contiguous()
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"polyspec": json.dumps(meta)})


def load(path: Path) -> TeacherData:
    from safetensors.torch import load_file

    try:
        t = load_file(str(path))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read cached verifier outputs {str(path)!r}: {exc}") from exc
    lengths = t["lengths"].tolist()
    sequences, offset = [], 0
    tokens = t["tokens"].tolist()
    for n in lengths:
        sequences.append(tokens[offset : offset + n])
        offset += n
    data = TeacherData(sequences, t["starts"].tolist(), t["prompt_lengths"].tolist())
    if "target_ids" in t:
        counts = [data.positions(i) for i in range(len(data))]
        data.target_ids = list(t["target_ids"].split(counts))
        data.target_logprobs = list(t["target_logprobs"].split(counts))
    return data


def cached(
    verifier, options: DataOptions, cache_dir: Path | None, batch_size: int = 8, progress: ProgressFn | None = None
) -> tuple[TeacherData, Path | None, bool]:
    """`build`, read from / written to `cache_dir` when given. Returns the data, its cache
    file and whether it came from the cache."""
    if cache_dir is None:
        return build(verifier, options, batch_size, progress), None, False
    path = Path(cache_dir) / f"{options.kind}-{options.language}-{cache_key(verifier, options)}.safetensors"
    if path.is_file():
        return load(path), path, True
    data = build(verifier, options, batch_size, progress)
    save(data, path, {"options": asdict(options), "verifier": verifier.name})
    return data, path, False
