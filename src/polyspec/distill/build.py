"""A drafter cut from the verifier itself: its embeddings, first L layers, final norm and head.

No smaller model shares Gemma-3's tokenizer, so the drafter is the verifier's own bottom layers
(as layer-skipping and self-speculative drafters are), optionally with a head over a reduced
vocabulary (`polyspec.drafters.reduced_head`). Models are named by local path or hub id: embedded
asset names are resolved before they get here (`polyspec.specs.model_path`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn

from polyspec.drafters.reduced_head import reduced_head, text_config
from polyspec.errors import UserError


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Loading a checkpoint into fewer layers warns about every weight left out; that is the
    point here, so the warnings are silenced for the duration."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def truncated_config(config, layers: int):
    """A copy of `config` with only the first `layers` decoder layers."""
    config = copy.deepcopy(config)
    text = text_config(config)
    total = text.num_hidden_layers
    if not 1 <= layers <= total:
        raise UserError(f"--layers must be between 1 and the verifier's {total} layers, got {layers}")
    text.num_hidden_layers = layers
    for name in ("layer_types",):  # per-layer lists follow the layers they describe
        value = getattr(text, name, None)
        if isinstance(value, list):
            setattr(text, name, value[:layers])
    return config


def verifier_layers(name: str) -> int:
    from transformers import AutoConfig

    from polyspec.models import from_pretrained

    return text_config(from_pretrained(AutoConfig, name)).num_hidden_layers


def truncated_model(name: str, layers: int, dtype: torch.dtype, device: str = "cpu") -> nn.Module:
    """The verifier `name` loaded with its first `layers` layers only (weights of the others are
    never read into memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from polyspec.models import from_pretrained

    config = truncated_config(from_pretrained(AutoConfig, name), layers)
    with quiet_transformers():
        model = from_pretrained(AutoModelForCausalLM, name, config=config, dtype=dtype)
    return model.to(device).eval()


def output_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits for final hidden states [..., hidden]: over the drafter's own columns (the kept ids
    for a reduced head), soft-capped as the model's forward would."""
    head = reduced_head(model)
    if head is not None:
        return head.reduced(hidden)
    logits = model.get_output_embeddings()(hidden)
    softcap = getattr(text_config(model.config), "final_logit_softcapping", None)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def column_ids(model: nn.Module) -> torch.Tensor | None:
    """[D] verifier id of each output column, or None when columns are ids."""
    head = reduced_head(model)
    return None if head is None else head.kept_ids


def decoder_body(model: nn.Module) -> nn.Module:
    """The stack of layers and final norm under the head (`model.model` in transformers)."""
    body = getattr(model, "model", None)
    if body is None:
        raise UserError(f"cannot find the decoder layers of {type(model).__name__}")
    return body
