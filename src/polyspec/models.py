"""Loading Hugging Face causal LMs from a local directory, the local hub cache or the hub.

Names here are paths or hub ids; embedded asset names are resolved at the edge
(`polyspec.specs`), so the engine knows no asset.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch

from polyspec.errors import UserError
from polyspec.narrow_linear import use_narrow_layout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """'auto' is bfloat16 where the hardware computes in it natively, else float32."""
    if name == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if device == "cpu" and cpu_has_native_bf16() else torch.float32
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but no CUDA device is available")
    return name


def hub_reachable(timeout: float = 3.0) -> bool:
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _load_errors() -> tuple[type[BaseException], ...]:
    """What loading a broken directory raises (a missing or unreadable file, a config that does not
    parse, weights of other shapes, a corrupt weights file)."""
    errors: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, RuntimeError)
    try:
        from safetensors import SafetensorError
    except ImportError:
        return errors
    return (*errors, SafetensorError)


def from_pretrained(loader, name: str, **kwargs):
    """Load from a local directory, the local hub cache, or the hub, with one clear error."""
    if Path(name).exists():
        if not Path(name).is_dir():
            raise UserError(f"model path {name!r} is not a directory holding a model")
        try:
            return loader.from_pretrained(name, **kwargs)
        except _load_errors() as exc:
            raise UserError(f"cannot load model from {name!r}: {_first_line(exc)}") from exc
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise UserError(f"model path {name!r} does not exist")
    try:
        return loader.from_pretrained(name, local_files_only=True, **kwargs)
    except (OSError, ValueError):
        pass
    if not hub_reachable():
        raise UserError(f"model {name!r} is not a local path and the model hub is unreachable")
    try:
        return loader.from_pretrained(name, **kwargs)
    except _load_errors() as exc:
        raise UserError(f"cannot load model {name!r}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return from_pretrained(AutoTokenizer, name)


def _require_config(name: str) -> None:
    if Path(name).is_dir() and not (Path(name) / "config.json").is_file():
        raise UserError(f"model directory {name!r} has no config.json: it does not hold a Hugging Face model")


def causal_lm_class(config):
    """AutoModelForCausalLM, or, for a config it does not map (the text part of a multimodal
    family, e.g. Emu3, Mllama, MusicGen), the causal-LM class its `architectures` names."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if type(config) in AutoModelForCausalLM._model_mapping:
        return AutoModelForCausalLM
    known = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    for name in getattr(config, "architectures", None) or []:
        klass = getattr(transformers, name, None) if name in known else None
        if klass is not None and isinstance(config, klass.config_class):
            return klass
    for klass_name in known:  # the causal-LM class whose config class this is
        klass = getattr(transformers, klass_name, None)
        if klass is not None and getattr(klass, "config_class", None) is type(config):
            return klass
    raise UserError(f"{type(config).__name__} ({config.model_type}) is no causal LM transformers knows")


def load_model(name: str, dtype: torch.dtype, device: str):
    from transformers import AutoConfig

    _require_config(name)
    config = from_pretrained(AutoConfig, name)
    loader = causal_lm_class(config)
    try:
        model = from_pretrained(loader, name, dtype=dtype)
    except UserError as exc:
        mismatch = _mismatched_shapes(loader, name, dtype) if Path(name).is_dir() else None
        if mismatch is None:
            raise
        raise UserError(f"the weights in {name!r} do not fit its config.json: {mismatch}") from exc.__cause__
    head = model.get_output_embeddings()
    if not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise UserError(
            f"{type(model).__name__} has no single output head ({type(head).__name__}): "
            "polyspec decodes one distribution over one vocabulary per step"
        )
    model = model.to(device).eval()
    use_narrow_layout(model)  # float32 on the CPU: verify calls over a few tokens cost far less
    return model


def _mismatched_shapes(loader, name: str, dtype: torch.dtype) -> str | None:
    """The first weight whose shape differs from what the config describes, said in words."""
    try:
        _, info = loader.from_pretrained(name, dtype=dtype, ignore_mismatched_sizes=True, output_loading_info=True)
    except Exception:  # noqa: BLE001 - broken in another way: the first error stands
        return None
    mismatched = sorted(info.get("mismatched_keys") or [])
    if not mismatched:
        return None
    key, stored, expected = mismatched[0]
    more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
    return f"{key} is {list(stored)} there, the config makes it {list(expected)}{more}"


def check_tokenizer(model: torch.nn.Module, tokenizer, name: str) -> None:
    """The tokenizer must be the model's: no id past the model's embedding, and every special
    token id the model's configs name (end of sequence, beginning, padding) one of its tokens."""
    rows = model.get_input_embeddings().weight.shape[0] if model.get_input_embeddings() is not None else None
    size = len(tokenizer)
    if rows is not None and size > rows:
        raise UserError(
            f"the tokenizer of {name!r} has {size} tokens but the model's embedding only {rows} rows: "
            "it is not this model's tokenizer"
        )
    configs = [model.config.get_text_config(), getattr(model, "generation_config", None)]
    for field in ("eos_token_id", "bos_token_id", "pad_token_id"):
        for config in configs:
            ids = getattr(config, field, None) if config is not None else None
            for token in ids if isinstance(ids, (list, tuple)) else [ids]:
                if isinstance(token, int) and not 0 <= token < size:
                    raise UserError(
                        f"the model in {name!r} names token {token} as its {field.removesuffix('_token_id')} "
                        f"token but its tokenizer has only {size} tokens: it is not this model's tokenizer"
                    )


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer."""

    model: torch.nn.Module
    tokenizer: object
    name: str

    @classmethod
    def load(cls, name: str, dtype: str = "auto", device: str = "cpu") -> LoadedModel:
        device = resolve_device(device)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        model = load_model(name, resolve_dtype(dtype, device), device)
        tokenizer = load_tokenizer(name)
        check_tokenizer(model, tokenizer, name)
        return cls(model=model, tokenizer=tokenizer, name=name)

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def max_length(self) -> int | None:
        config = self.model.config.get_text_config()
        return getattr(config, "max_position_embeddings", None)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype_name(self) -> str:
        dtype = next(self.model.parameters()).dtype
        return next(name for name, value in DTYPES.items() if value == dtype)


def synchronizer(device: torch.device):
    """What waits for the device's queued work, so timings measure it (a no-op on CPU)."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
