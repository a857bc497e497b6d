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


def from_pretrained(loader, name: str, **kwargs):
    """Load from a local directory, the local hub cache, or the hub, with one clear error."""
    if Path(name).exists():
        if not Path(name).is_dir():
            raise UserError(f"model path {name!r} is not a directory holding a model")
        try:
            return loader.from_pretrained(name, **kwargs)
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"cannot load model from {name!r}: {str(exc).splitlines()[0]}") from exc
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
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load model {name!r}: {str(exc).splitlines()[0]}") from exc


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return from_pretrained(AutoTokenizer, name)


def load_model(name: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    model = from_pretrained(AutoModelForCausalLM, name, dtype=dtype)
    return model.to(device).eval()


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
        tokenizer = load_tokenizer(name)
        model = load_model(name, resolve_dtype(dtype, device), device)
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
