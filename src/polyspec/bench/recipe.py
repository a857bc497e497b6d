"""The dry run of a preset with its own models (the study's: `polyspec bench --recipe study
--dry-run`): the same architectures built from their known configs (`KNOWN_CONFIGS`, the real
text-model values), shrunk in width and depth but keeping the layer pattern and the head
counts, with random float32 weights and a byte-level tokenizer. Needs neither the weights nor a
GPU. Random models agree on little, so a dry run checks the wiring (hybrid rollback, every mode
and gamma, greedy identity with plain decoding), not acceptance rates.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from polyspec.errors import UserError
from polyspec.models import LoadedModel

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
DRY_RUN_VOCAB = 320  # the 259 byte tokens, padded as real vocabularies are


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


@lru_cache(maxsize=1)
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


def dry_run_model(name: str) -> LoadedModel:
    """`name`'s architecture, shrunk (`shrunk_config`), with random weights seeded by the name."""
    from transformers import Qwen3_5ForCausalLM

    if name not in KNOWN_CONFIGS:
        raise UserError(f"no known config for {name!r}: the dry run knows {', '.join(KNOWN_CONFIGS)}")
    torch.manual_seed(list(KNOWN_CONFIGS).index(name))
    model = Qwen3_5ForCausalLM(shrunk_config(name, DRY_RUN_VOCAB)).eval()
    return LoadedModel(model=model, tokenizer=byte_tokenizer(), name=f"{name} (dry run)")
