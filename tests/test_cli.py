"""The generate command's contract: one JSON object on stdout, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from fixtures import SPECIALS, run_cli, save, tiny_gemma


def test_generate_json_matches_transformers_greedy(verifier, verifier_dir):
    prompt = "w5 w6 w7 w5 w6 w7 w5"
    code, out, _ = run_cli("generate", "--verifier", str(verifier_dir), "--drafter", "prompt-lookup",
        "--gamma", "3", "--prompt", prompt, "--max-new-tokens", "25", "--dtype", "float32", "--json",
    )  # fmt: skip
    assert code == 0
    result = json.loads(out)
    ids = verifier.tokenizer(prompt)["input_ids"]
    assert ids[0] == 2  # BOS added by the tokenizer's defaults
    expected = verifier.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=25, pad_token_id=0)
    assert result["token_ids"] == expected[0, len(ids) :].tolist()
    assert set(result["stats"]) >= {
        "drafted", "accepted", "acceptance_rate", "verifier_calls", "tokens_per_call",
        "draft_seconds", "verify_seconds", "seconds", "tokens_per_second",
    }  # fmt: skip
    assert result["text"] == verifier.tokenizer.decode(result["token_ids"], skip_special_tokens=True)


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)} | {f"x{i}": i + 4 for i in range(60)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    return save(tiny_gemma(seed=9, layers=2), tokenizer, tmp_path_factory.mktemp("other"))


def bad_inputs(verifier_dir, other_vocab_dir, tmp_path):
    v = ["--verifier", str(verifier_dir), "--dtype", "float32"]
    unreadable = tmp_path / "not-utf8.txt"
    unreadable.write_bytes(b"\xff\xfe\xfa")
    return {
        "missing model": ["--verifier", str(tmp_path / "nope"), "--prompt", "w1"],
        "unloadable model": ["--verifier", str(tmp_path), "--prompt", "w1"],
        "other vocabulary": [*v, "--drafter", f"model:{other_vocab_dir}", "--prompt", "w1"],
        "gamma 0": [*v, "--gamma", "0", "--prompt", "w1"],
        "empty prompt": [*v, "--prompt", ""],
        "beyond context": [*v, "--prompt", "w1 w2", "--max-new-tokens", "1000"],
        "unknown drafter": [*v, "--drafter", "telepathy", "--prompt", "w1"],
        "missing prompt file": [*v, "--prompt-file", str(tmp_path / "absent.txt")],
        "unreadable prompt file": [*v, "--prompt-file", str(unreadable)],
        "no prompt": [*v],
        "bad dtype": [*v, "--dtype", "float8", "--prompt", "w1"],
        "hub unreachable": ["--verifier", "no-such-org/no-such-model", "--prompt", "w1"],
        "unknown option": [*v, "--bogus", "--prompt", "w1"],
        "not a number": [*v, "--gamma", "three", "--prompt", "w1"],
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing model", "unloadable model", "other vocabulary", "gamma 0", "empty prompt", "beyond context",
        "unknown drafter", "missing prompt file", "unreadable prompt file", "no prompt", "bad dtype",
        "hub unreachable", "unknown option", "not a number",
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(monkeypatch, verifier_dir, other_vocab_dir, tmp_path, case):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never wait on a network here
    args = bad_inputs(verifier_dir, other_vocab_dir, tmp_path)[case]
    code, out, err = run_cli("generate", *args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("polyspec: error:"), err
    assert out == ""


def test_entry_point_prints_no_traceback(tmp_path):
    exe = [sys.executable, "-c", "from polyspec.cli import main; main()"]
    proc = subprocess.run(
        [*exe, "generate", "--verifier", str(tmp_path / "absent"), "--prompt", "hi"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
