"""Tiny random models of any architecture in transformers' causal-LM mapping, built on CPU from the
architecture's own config class with its sizes shrunk (2-4 layers, hidden 64, a 64-token vocabulary
matching the tests' word-level tokenizer).

`tiny_config(model_type)` sets the common size fields a config has (hidden_size, intermediate_size,
num_hidden_layers, heads, head_dim, vocab_size, max_position_embeddings, expert counts, recurrent
and convolution state sizes, ...), shortens per-layer patterns (`layer_types` and its kin) to a few
layers that keep every kind of layer the architecture has, shrinks nested sub-configs the same way,
then applies the overrides of the families whose sizes depend on each other (FAMILY). A plain
module, imported by tests and by benchmarks/architectures.py.
"""

from __future__ import annotations

import dataclasses

import torch

VOCAB = 64  # the tests' tokenizer: 4 special tokens and 60 words
PAD, EOS, BOS = 0, 1, 2
HIDDEN = 64
LAYERS = 2
SLIDING_WINDOW = 8  # short, so that sequences outgrow it

# Field name -> tiny value, set wherever a config has the field (and it is not None).
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "d_model": HIDDEN,
    "n_embd": HIDDEN,
    "embed_dim": HIDDEN,
    "embedding_size": HIDDEN,
    "embedding_dim": HIDDEN,
    "word_embed_proj_dim": HIDDEN,
    "intermediate_size": 128,
    "ffn_dim": 128,
    "ffn_hidden_size": 128,
    "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128,
    "n_inner": 128,
    "num_hidden_layers": LAYERS,
    "num_layers": LAYERS,
    "n_layer": LAYERS,
    "n_layers": LAYERS,
    "decoder_layers": LAYERS,
    "encoder_layers": LAYERS,
    "num_decoder_layers": LAYERS,
    "num_encoder_layers": LAYERS,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "num_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_kv_heads": 2,
    "multi_query_group_num": 2,
    "num_query_groups": 2,
    "head_dim": 16,
    "attention_head_dim": 16,
    "attention_head_size": 16,
    "max_position_embeddings": 512,
    "n_positions": 512,
    "n_ctx": 512,
    "max_target_positions": 512,
    "max_source_positions": 512,
    "original_max_position_embeddings": 512,
    "sliding_window": SLIDING_WINDOW,
    "sliding_window_size": SLIDING_WINDOW,
    "attention_window_size": SLIDING_WINDOW,
    "local_attention_window_len": SLIDING_WINDOW,
    "attention_chunk_size": SLIDING_WINDOW,
    # mixture of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "moe_k": 2,
    "top_k_experts": 2,
    "moe_topk": 2,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "moe_num_shared_experts": 1,
    "num_expert_group": 1,
    "n_group": 1,
    "topk_group": 1,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "shared_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "shared_experts_intermediate_size": 32,
    "expert_ffn_hidden_size": 32,
    "dense_intermediate_size": 128,
    "prefix_dense_intermediate_size": 128,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "moe_latent_size": None,
    # multi-head latent attention
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "qk_head_dim": 16,
    "index_head_dim": 16,
    "index_n_heads": 2,
    "indexer_n_heads": 2,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 16,
    "index_topk": 8,
    # recurrent and convolution states
    "state_size": 8,
    "ssm_state_size": 8,
    "mamba_d_state": 8,
    "time_step_rank": 8,
    "mamba_dt_rank": 8,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_num_heads": 4,
    "linear_head_dim": 16,
    "chunk_size": 16,
    "mamba_chunk_size": 16,
    "num_nextn_predict_layers": 0,
    "num_mtp_layers": 0,
    "rotary_dim": 8,
    "num_blocks": LAYERS,
    "emb_dim": HIDDEN,
    "shape_vocab_size": VOCAB,
    "pronunciation_vocab_size": VOCAB,
    "shape_embed_dim": 16,
    "pronunciation_embed_dim": 16,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16,
    "is_decoder": True,  # encoder-style families (BERT, RoBERTa, ...) are causal only as decoders
}
# Fields where None switches a feature off (elsewhere None means "derive it", and is set too).
OFF_WHEN_NONE = frozenset(
    {
        "sliding_window",
        "sliding_window_size",
        "attention_window_size",
        "attention_chunk_size",
        "local_attention_window_len",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "qk_head_dim",
        "index_head_dim",
        "index_n_heads",
        "indexer_n_heads",
        "indexer_kv_heads",
        "indexer_head_dim",
        "index_topk",
        "first_k_dense_replace",
        "num_dense_layers",
        "n_shared_experts",
        "num_shared_experts",
        "moe_num_shared_experts",
        "shared_expert_intermediate_size",
        "shared_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "shared_experts_intermediate_size",
        "num_expert_group",
        "n_group",
        "topk_group",
        "original_max_position_embeddings",
    }
)
# Per-layer pattern fields: shortened to a few layers keeping every kind of layer.
PATTERNS = ("layer_types", "layers_block_type", "block_types", "attn_layers", "mlp_layer_types", "moe_layer_types")

MAMBA2_HEADS = {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_expand": 2, "mamba_d_state": 8}
# Overrides for families whose sizes depend on one another (applied after COMMON).
FAMILY: dict[str, dict] = {
    "mamba": {"intermediate_size": 128, "time_step_rank": 8},
    "falcon_mamba": {"intermediate_size": 128, "time_step_rank": 8},
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1, "expand": 2, "time_step_rank": 8},
    "bamba": {**MAMBA2_HEADS, "attn_layer_indices": [1]},
    "falcon_h1": {**MAMBA2_HEADS, "mamba_d_ssm": 128},
    "granitemoehybrid": {**MAMBA2_HEADS, "layer_types": ["linear_attention", "full_attention"]},
    "nemotron_h": {"mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 1, "expand": 2},
    "zamba": {
        "layers_block_type": ["hybrid", "linear_attention", "hybrid"],
        "attention_hidden_size": 2 * HIDDEN,
        "attention_head_dim": 2 * HIDDEN // 4,
        "num_key_value_heads": 4,
        "n_mamba_heads": 2,
        "mamba_expand": 2,
    },
    "zamba2": {
        "attention_hidden_size": 2 * HIDDEN,
        "attention_head_dim": 2 * HIDDEN // 4,
        "num_key_value_heads": 4,
        "num_query_groups": 4,
        "n_mamba_heads": 4,
        "mamba_headdim": 32,
        "mamba_ngroups": 1,
        "adapter_rank": 8,
        "mamba_expand": 2,
        "hybrid_layer_ids": [1],
    },
    "recurrent_gemma": {"lru_width": HIDDEN, "num_key_value_heads": 1, "block_types": ["recurrent", "attention"]},
    "jamba": {
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "mamba_d_state": 8,
        "mamba_expand": 2,
        "use_mamba_kernels": False,
    },
    "dots1": {"n_shared_experts": 1},
    "cohere_compass_text": {
        "rope_parameters": {
            kind: {"rope_type": "default", "rope_theta": 10000.0} for kind in ("full_attention", "sliding_attention")
        }
    },
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "gemma3n_text": {
        "num_kv_shared_layers": 0,
        "activation_sparsity_pattern": [0.0] * LAYERS,
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size_per_layer_input": 16,
        "laurel_rank": 8,
        "altup_num_inputs": 2,
    },
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 8,
        "indexer_compress_ratio": 2,
        "hc_lowrank": 8,
        "ple_embed_dim": 16,
        "heads_per_ngram": 2,
        "ngram_vocab_size_base": VOCAB,
        "make_ngram_vocab_size_divisible_by": 8,
        "split_ngram_parts": 1,
    },
    "zaya": {"num_experts_per_tok": 1},
    # Moshi masks every earlier position but caches a sliding window: past the window its own
    # generate() attends to a cut cache; a window wider than the tests' sequences keeps it consistent.
    "moshi": {"sliding_window": 512},
    "musicgen": {"num_codebooks": 1},
    "musicgen_melody": {"num_codebooks": 1},
    "xmod": {"default_language": "en_XX"},
    "reformer": {"axial_pos_embds": False, "attn_layers": ["local", "local"], "attention_head_size": 16},
    "lfm2": {"layer_types": ["conv", "full_attention"]},  # its default pattern comes from full_attn_idxs
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "rwkv": {"attention_hidden_size": HIDDEN, "context_length": 512},
    # The config rounds head sizes up to multiples of 64, the model does not: 128 keeps them equal.
    "xlstm": {"hidden_size": 128, "embedding_dim": 128, "num_heads": 4, "max_inference_chunksize": 16},
    # DbrxAttention reads a rope_theta that its config class does not declare.
    "dbrx": {
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 128, "hidden_size": HIDDEN, "moe_num_experts": 4, "moe_top_k": 2},
    },
}


def _pattern(values: list) -> list:
    """A few layers that keep every kind in `values`, in their order of first appearance; each
    kind keeps the layer before it when that one differs (a full-attention layer after linear
    ones stays after one)."""
    kinds = list(dict.fromkeys(values))
    if len(kinds) == 1:
        return [kinds[0]] * LAYERS
    shortened = kinds[:]
    while len(shortened) < LAYERS:
        shortened.insert(0, kinds[0])
    return shortened


def _fields(config) -> dict:
    names = [field.name for field in dataclasses.fields(config)] if dataclasses.is_dataclass(config) else vars(config)
    values = {}
    for name in names:
        try:
            values[name] = getattr(config, name, None)
        except Exception:  # per-layer attributes of heterogeneous configs
            values[name] = vars(config).get(name)
    return values


def shrink(config, overrides: dict | None = None):
    """A copy of `config` with tiny sizes (and its nested sub-configs shrunk alike)."""
    from transformers import PretrainedConfig

    values = _fields(config)
    changes = {}
    for name, value in COMMON.items():
        if name in values and (values[name] is not None or name not in OFF_WHEN_NONE):
            changes[name] = value
    if values.get("kv_lora_rank") is not None:  # latent attention: one key/value head per query head
        changes["num_key_value_heads"] = changes.get("num_attention_heads", 4)
        if "head_dim" in values:
            changes["head_dim"] = COMMON["qk_rope_head_dim"]
    for name in PATTERNS:
        pattern = values.get(name)
        if isinstance(pattern, (list, tuple)) and pattern and all(isinstance(v, str) for v in pattern):
            changes[name] = _pattern(list(pattern))
    for name, value in values.items():
        if isinstance(value, PretrainedConfig):  # as a dict: parents fill in what they share
            changes[name] = shrink(value).to_dict()
    for name in ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id"):
        if name in values:
            changes[name] = {"pad_token_id": PAD, "eos_token_id": EOS}.get(name, BOS)
    for name in ("forced_eos_token_id", "forced_bos_token_id"):  # generation extras, not the model's greedy
        if name in values:
            changes[name] = None
    changes.update(overrides or {})
    layer_count = next((len(changes[name]) for name in PATTERNS if isinstance(changes.get(name), list)), None)
    if layer_count is not None:
        for name in ("num_hidden_layers", "num_layers", "n_layer", "n_layers"):
            if name in values and values[name] is not None and name not in (overrides or {}):
                changes[name] = layer_count
    return type(config)(**changes)


def tiny_config(model_type: str, overrides: dict | None = None):
    """The architecture's own config class, shrunk; `overrides` last."""
    config_class = model_class(model_type).config_class  # composite configs: the text model's own
    merged = {**FAMILY.get(config_class.model_type, {}), **FAMILY.get(model_type, {}), **(overrides or {})}
    return shrink(config_class(), merged)


def model_class(model_type: str):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def tiny_model(
    model_type: str,
    seed: int = 0,
    base: torch.nn.Module | None = None,
    noise: float = 0.3,
    overrides: dict | None = None,
):
    """A random tiny model in float32 and eval mode; with `base`, a copy of it whose weights carry
    relative Gaussian noise (a drafter that is often but not always right)."""
    config = tiny_config(model_type, overrides) if base is None else base.config
    torch.manual_seed(seed)
    model = model_class(model_type)(config).eval().float()
    with torch.no_grad():
        if base is not None:
            for mine, theirs in zip(model.parameters(), base.parameters(), strict=True):
                if theirs.numel() > 1 and theirs.is_floating_point():
                    mine.copy_(theirs + noise * theirs.std() * torch.randn_like(theirs))
                else:
                    mine.copy_(theirs)
        else:
            # Random weights give near-uniform logits; sharpen them so that outputs have
            # structure (repeats, confident tokens) like a trained model's.
            head = model.get_output_embeddings()
            if head is not None and getattr(head, "weight", None) is not None:
                head.weight.mul_(8.0)
    return model
