"""The study's full-scale run as one recipe: Qwen3.5-9B verifier, Qwen3.5-0.8B drafter, gamma
2-5, greedy and sampling (top-k 50, top-p 0.9, repetition penalty 1.1 over 16 tokens), the
study's 12 languages.

`run_recipe(STUDY_RECIPE, dry_run=False, out_dir)` needs the weights (in the local cache or
downloadable) and, in practice, a GPU. Without the weights it stops before doing anything.
`dry_run=True` needs neither: it builds the same architectures from their known configs
(`KNOWN_CONFIGS`, the real text-model values), shrunk in width and depth but keeping the layer
pattern and the head counts, with random float32 weights and a byte-level tokenizer, and runs
every configuration for max(gammas) + 1 tokens (room for one full draft at the largest gamma)
on built-in sentences, two per language. Random models agree on little, so the dry run checks
the wiring (hybrid rollback, every mode and gamma, greedy identity with plain decoding), not
acceptance rates.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from polyspec.decoding import Decoder
from polyspec.drafters.model import ModelDrafter
from polyspec.errors import UserError
from polyspec.models import LoadedModel, hub_reachable
from polyspec.sampling import STUDY_SAMPLING, SamplingConfig


@dataclass(frozen=True)
class Recipe:
    name: str
    verifier: str
    drafter: str
    gammas: tuple[int, ...]
    modes: tuple[str, ...]  # "greedy" and/or "sampling"
    sampling: SamplingConfig  # used in "sampling" mode
    languages: tuple[str, ...]
    max_new_tokens: int = 128
    prompts_per_language: int = 2
    dtype: str = "bfloat16"
    device: str = "auto"
    seed: int = 0


LANGUAGE_NAMES = {
    "amh": "Amharic",
    "ber": "Berber",
    "chr": "Cherokee",
    "grn": "Guarani",
    "haw": "Hawaiian",
    "ibo": "Igbo",
    "npi": "Nepali",
    "oci": "Occitan",
    "que": "Quechua",
    "yor": "Yoruba",
    "zgh": "Standard Moroccan Tamazight",
    "zh": "Chinese",
}

STUDY_RECIPE = Recipe(
    name="study",
    verifier="Qwen/Qwen3.5-9B",
    drafter="Qwen/Qwen3.5-0.8B",
    gammas=(2, 3, 4, 5),
    modes=("greedy", "sampling"),
    sampling=STUDY_SAMPLING,
    languages=tuple(LANGUAGE_NAMES),
)

# Text-model values of the released checkpoints (both are vision-language models; only their
# language model is used). Every fourth layer is full attention, the rest gated delta-net.
_QWEN35_SHARED = dict(
    vocab_size=248320,
    head_dim=256,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    eos_token_id=248044,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
)
KNOWN_CONFIGS = {
    "Qwen/Qwen3.5-9B": dict(
        _QWEN35_SHARED,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=32,
        num_attention_heads=16,
        num_key_value_heads=4,
        linear_num_value_heads=32,
        tie_word_embeddings=False,
    ),
    "Qwen/Qwen3.5-0.8B": dict(
        _QWEN35_SHARED,
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=2,
        linear_num_value_heads=16,
        tie_word_embeddings=True,
    ),
}
FULL_ATTENTION_INTERVAL = 4

# Dry-run shrinking: widths / 32, head dimensions / 8, one period of the layer pattern (4 layers)
# per 16 real layers; head counts, the layer pattern and the rotary fraction are kept.
WIDTH_DIVISOR, HEAD_DIM_DIVISOR, LAYER_DIVISOR = 32, 8, 4

# Two short sentences per language for the dry run (greetings and "one day, ..." openings).
DRY_RUN_TEXTS = {
    "amh": ("ሰላም ለሁላችሁ።", "አንድ ቀን አንድ ልጅ ወደ ገበያ ሄደ።"),
    "ber": ("Azul fell-awen.", "Yiwen n wass, yella yiwen n wergaz."),
    "chr": ("ᎣᏏᏲ.", "ᏌᏊ ᎢᎦ, ᎠᏧᏣ ᎤᏪᏅᏒᎩ."),
    "grn": ("Mba'éichapa.", "Peteĩ árape, oĩ va'ekue peteĩ kuimba'e."),
    "haw": ("Aloha kākou.", "I kekahi lā, ua hele ke keiki i ke kai."),
    "ibo": ("Ndewo unu.", "Otu ụbọchị, otu nwoke gara ahịa."),
    "npi": ("नमस्ते।", "एक दिन, एउटा केटा बजार गयो।"),
    "oci": ("Bonjorn a totes.", "Un jorn, un òme anèt al mercat."),
    "que": ("Allillanchu.", "Huk p'unchaw, huk runa qhatuman rirqa."),
    "yor": ("Ẹ káàárọ̀.", "Ní ọjọ́ kan, ọkùnrin kan lọ sí ọjà."),
    "zgh": ("ⴰⵣⵓⵍ ⴼⵍⵍⴰⵡⵏ.", "ⵢⴰⵏ ⵡⴰⵙⵙ, ⵢⵓⵛⴽⴰ ⵢⴰⵏ ⵓⵔⴱⴰ."),
    "zh": ("你好。", "有一天，一个男孩去了市场。"),
}
STORY_TOPICS = ("old fisherman", "orange cat")


def story_prompts(language: str, count: int) -> list[str]:
    """The study's held-out task: 'Write a story in {language} about a(n) {adjective noun}'."""
    name = LANGUAGE_NAMES.get(language, language)
    topics = [STORY_TOPICS[i % len(STORY_TOPICS)] for i in range(count)]
    return [f"Write a story in {name} about {'an' if t[0] in 'aeiou' else 'a'} {t}.\n" for t in topics]


def shrunk_config(name: str, vocab_size: int):
    """`KNOWN_CONFIGS[name]` made small enough to run on a CPU in milliseconds."""
    from transformers import Qwen3_5TextConfig

    known = dict(KNOWN_CONFIGS[name])
    layers = FULL_ATTENTION_INTERVAL * max(1, known["num_hidden_layers"] // (FULL_ATTENTION_INTERVAL * LAYER_DIVISOR))
    head_dim = known["head_dim"] // HEAD_DIM_DIVISOR
    rope = dict(known["rope_parameters"])
    # The rotary half-dimension shrinks with head_dim; the multimodal sections keep their shares.
    half = int(head_dim * rope["partial_rotary_factor"]) // 2
    sections = [round(s * half / sum(rope["mrope_section"])) for s in rope["mrope_section"]]
    sections[0] += half - sum(sections)
    rope["mrope_section"] = sections
    known.update(
        vocab_size=vocab_size,
        hidden_size=known["hidden_size"] // WIDTH_DIVISOR,
        intermediate_size=known["intermediate_size"] // WIDTH_DIVISOR,
        num_hidden_layers=layers,
        head_dim=head_dim,
        linear_key_head_dim=known["linear_key_head_dim"] // HEAD_DIM_DIVISOR,
        linear_value_head_dim=known["linear_value_head_dim"] // HEAD_DIM_DIVISOR,
        max_position_embeddings=4096,
        rope_parameters=rope,
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
        layer_types=[
            "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention" for i in range(layers)
        ],
    )
    return Qwen3_5TextConfig(**known)


def byte_tokenizer():
    """Every UTF-8 byte is a token (ids 3-258), after <pad> 0, <eos> 1, <bos> 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def dry_run_models(recipe: Recipe, seed: int = 0) -> tuple[LoadedModel, LoadedModel]:
    from transformers import Qwen3_5ForCausalLM

    tokenizer = byte_tokenizer()
    vocab_size = 320  # the 259 byte tokens, padded as real vocabularies are
    loaded = []
    for offset, name in enumerate((recipe.verifier, recipe.drafter)):
        if name not in KNOWN_CONFIGS:
            raise UserError(f"no known config for {name!r}: the dry run knows {', '.join(KNOWN_CONFIGS)}")
        torch.manual_seed(seed + offset)
        model = Qwen3_5ForCausalLM(shrunk_config(name, vocab_size)).eval()
        loaded.append(LoadedModel(model=model, tokenizer=tokenizer, name=f"{name} (dry run)"))
    return loaded[0], loaded[1]


def real_models(recipe: Recipe) -> tuple[LoadedModel, ModelDrafter]:
    from polyspec.drafters.model import make

    missing = [name for name in (recipe.verifier, recipe.drafter) if not _cached(name)]
    if missing and not hub_reachable():
        raise UserError(
            f"the {recipe.name} recipe needs {' and '.join(missing)}: not in the local model cache and the model "
            "hub is unreachable (a dry run checks the recipe without the weights)"
        )
    verifier = LoadedModel.load(recipe.verifier, dtype=recipe.dtype, device=recipe.device)
    return verifier, make(recipe.drafter, verifier)


def _cached(name: str) -> bool:
    if Path(name).is_dir():
        return True
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def run_recipe(
    recipe: Recipe,
    dry_run: bool,
    out_dir: Path | str,
    progress: bool = True,
    prompts: dict[str, list[str]] | None = None,
) -> list[dict]:
    """Plain decoding and every (mode, gamma) with the model drafter, for each language's prompts.

    One record per run, also written as JSON lines to `out_dir/{recipe.name}[-dry-run].jsonl`.
    `prompts` (language -> texts) replaces the built-in prompts. The dry run generates
    max(gammas) + 1 tokens per run: room for one full draft at the largest gamma.
    """
    unknown = [code for code in recipe.languages if code not in LANGUAGE_NAMES and not (prompts and code in prompts)]
    if unknown:
        raise UserError(f"no prompts for language(s) {', '.join(unknown)}")
    for mode in recipe.modes:
        if mode not in ("greedy", "sampling"):
            raise UserError(f"unknown decoding mode {mode!r}: use greedy or sampling")
    if dry_run:
        recipe = replace(recipe, dtype="float32", device="cpu", max_new_tokens=max(recipe.gammas) + 1)
        verifier, draft_model = dry_run_models(recipe, recipe.seed)
        drafter = ModelDrafter(draft_model, verifier.vocab_size)
    else:
        verifier, drafter = real_models(recipe)
    out_path = Path(out_dir) / f"{recipe.name}{'-dry-run' if dry_run else ''}.jsonl"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    decoder = Decoder(verifier)
    log = (lambda message: print(message, flush=True)) if progress else (lambda message: None)
    records = []
    with out_path.open("w", encoding="utf-8") as out:
        _warm_up(decoder, drafter, recipe)
        for language in recipe.languages:
            texts = (prompts or {}).get(language) or _builtin_prompts(language, recipe, dry_run)
            for index, text in enumerate(texts):
                ids = decoder.encode(text)
                for mode in recipe.modes:
                    for record in _runs(decoder, drafter, recipe, ids, mode):
                        record.update(recipe=recipe.name, dry_run=dry_run, language=language, prompt_index=index)
                        out.write(json.dumps(record, ensure_ascii=False) + "\n")
                        out.flush()
                        records.append(record)
                log(f"{language} prompt {index}: {len(recipe.modes) * (1 + len(recipe.gammas))} runs done")
    log(f"{len(records)} records written to {out_path}")
    return records


def _builtin_prompts(language: str, recipe: Recipe, dry_run: bool) -> list[str]:
    if dry_run:
        return list(DRY_RUN_TEXTS[language][: recipe.prompts_per_language])
    return story_prompts(language, recipe.prompts_per_language)


def _warm_up(decoder: Decoder, drafter: ModelDrafter, recipe: Recipe) -> None:
    """Keeps one-time setup (kernels, allocations) out of the first timed run."""
    ids = decoder.encode("Hello")
    decoder.generate(ids, None, max_new_tokens=2)
    decoder.generate(ids, drafter, gamma=max(recipe.gammas), max_new_tokens=2)


def _runs(decoder: Decoder, drafter: ModelDrafter, recipe: Recipe, ids: list[int], mode: str) -> list[dict]:
    sampling = SamplingConfig() if mode == "greedy" else recipe.sampling
    # Never stop at EOS: plain and speculative runs then do the same amount of work.
    common = dict(sampling=sampling, max_new_tokens=recipe.max_new_tokens, seed=recipe.seed, eos_token_ids=frozenset())
    started = time.time()
    plain = decoder.generate(ids, None, **common)
    runs = [_record(plain, mode, "none", 0, recipe, started)]
    for gamma in recipe.gammas:
        started = time.time()
        result = decoder.generate(ids, drafter, gamma=gamma, **common)
        record = _record(result, mode, f"model:{recipe.drafter}", gamma, recipe, started)
        record["same_as_plain"] = result.token_ids == plain.token_ids
        record["speedup"] = plain.stats.seconds / result.stats.seconds if result.stats.seconds else 0.0
        runs.append(record)
    return runs


def _record(result, mode: str, drafter: str, gamma: int, recipe: Recipe, started: float) -> dict:
    return {
        "verifier": recipe.verifier,
        "drafter": drafter,
        "mode": mode,
        "gamma": gamma,
        "seed": recipe.seed,
        "dtype": recipe.dtype,
        "started": started,
        "token_ids": result.token_ids,
        "text": result.text,
        **result.stats.to_dict(),
    }
