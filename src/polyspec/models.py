"""Loading Hugging Face causal LMs, and a model whose cache can be cut back after a rejection.

`CachedLM` keeps the cache of every token fed so far. Verifying a draft feeds k + 1 tokens in
one forward; when only some are kept, `rollback` cuts every layer back to the kept prefix
instead of recomputing it. Sliding-window layers (Gemma 3) keep the states they would drop
until the next rollback, so they too can be cut back once a sequence outgrows the window.
Recurrent states (Qwen3.5's linear attention) are restored by `polyspec.state_rollback`.
"""

from __future__ import annotations

import os
import socket
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch

from polyspec.errors import UserError
from polyspec.state_rollback import state_rollback_for

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


def resolve_name(name: str) -> str:
    """Names of embedded assets ('gemma3-270m', 'qwen3.5', ...) resolve to their local copies."""
    try:
        from polyspec.assets.store import resolve_model_name
    except ImportError:
        return name
    return resolve_model_name(name)


def _from_pretrained(loader, name: str, **kwargs):
    """Load from a local directory, the local hub cache, or the hub, with one clear error."""
    name = resolve_name(name)
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

    return _from_pretrained(AutoTokenizer, name)


def load_model(name: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    model = _from_pretrained(AutoModelForCausalLM, name, dtype=dtype)
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


class CachedLM:
    """Feeds tokens to a causal LM one chunk at a time and can cut its cache back.

    Invariant: the cache holds exactly `self.length` tokens.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = None
        self.length = 0
        self.states = state_rollback_for(model)  # None unless some layers carry a recurrent state

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        self._recording = False
        if self.states is not None:
            self.states.reset(self.cache)
            self._recording = True

    @torch.inference_mode()
    def forward(self, tokens: list[int], num_logits: int | None = None) -> torch.Tensor:
        """Feed `tokens` after the cached ones; returns logits [n, V] for the last `num_logits`
        positions (all by default)."""
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(self.length, self.length + len(tokens), device=self.device)
        with self.states.recording(self.length, tokens) if self.states is not None else nullcontext():
            out = self.model(
                input_ids=input_ids,
                past_key_values=self.cache,
                position_ids=positions.unsqueeze(0),
                use_cache=True,
                logits_to_keep=num_logits or 0,
            )
        self.length += len(tokens)
        if not self._recording:
            # Only after the first forward do all layers exist; from then on sliding-window
            # layers keep what they would drop until `rollback` says how much is needed.
            self.cache.activate_past_recording()
            self._recording = True
        return out.logits[0]

    def rollback(self, length: int) -> None:
        """Cut the cache back to its first `length` tokens (also trims sliding windows)."""
        if length > self.length:
            raise ValueError(f"cannot roll back to {length} tokens: only {self.length} cached")
        if not self._recording:  # nothing fed yet
            return
        if self.states is not None:
            self.states.rollback(self, length)
            return
        self.cache.crop(length - self.length)
        self.length = length


def check_rollback_supported(model: torch.nn.Module) -> None:
    """Fail early, with a clear message, for caches that cannot be cut back."""
    state_rollback_for(model)
