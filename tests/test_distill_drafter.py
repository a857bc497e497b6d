"""Drafters cut from the verifier: what `distill init` builds, how it saves and loads, and that
decoding with them stays lossless (greedy identity, exact sampling distribution) also when
their vocabulary is reduced."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures import (
    check_sampling_is_exact,
    corpus_lines,
    hf_greedy,
    install_fake_udhr,
    random_prompts,
    run_cli,
    save,
    tiny_gemma,
)

from polyspec.assets import languages
from polyspec.assets.languages import Language
from polyspec.decoding import Decoder
from polyspec.distill.init import VocabSource, init_drafter
from polyspec.distill.vocab import always_kept, top_tokens
from polyspec.drafters.distilled import load_drafter, read_meta
from polyspec.drafters.reduced_head import ReducedHead, reduced_head
from polyspec.errors import UserError
from polyspec.specs import make_drafter

KEEP = 40  # of the tiny vocabulary's 64 ids


@pytest.fixture(scope="module")
def reduced_dir(tmp_path_factory, verifier_dir):
    out = tmp_path_factory.mktemp("distill") / "reduced"
    init_drafter(str(verifier_dir), 3, out, KEEP, [VocabSource("test", corpus_lines())])
    return out


@pytest.fixture(scope="module")
def full_dir(tmp_path_factory, verifier_dir):
    out = tmp_path_factory.mktemp("distill") / "full"
    init_drafter(str(verifier_dir), 2, out)
    return out


def test_the_drafter_is_the_verifiers_bottom_layers_norm_and_head(verifier, full_dir):
    drafter = load_drafter(full_dir, torch.float32)
    config = drafter.config
    assert config.num_hidden_layers == 2 and config.layer_types == verifier.model.config.layer_types[:2]
    theirs = verifier.model.state_dict()
    for name, tensor in drafter.state_dict().items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=0)
    ids = torch.tensor([[2, 5, 9, 11, 30, 7]])
    with torch.inference_mode():
        hidden = verifier.model(ids, output_hidden_states=True).hidden_states[2]
        early_exit = verifier.model.lm_head(verifier.model.model.norm(hidden))
        torch.testing.assert_close(drafter(ids).logits, early_exit, rtol=1e-5, atol=1e-5)


def test_the_checkpoint_is_a_stock_transformers_model(full_dir, reduced_dir):
    from transformers import AutoModelForCausalLM

    for path in (full_dir, reduced_dir):
        model = AutoModelForCausalLM.from_pretrained(path)
        assert model.get_output_embeddings().weight.shape[0] == len(model.get_input_embeddings().weight)
    assert (reduced_dir / "draft_head.safetensors").is_file() and not (full_dir / "draft_head.safetensors").exists()


def test_reduced_head_keeps_the_most_frequent_ids_and_their_logits(verifier, reduced_dir, tokenizer):
    drafter = load_drafter(reduced_dir, torch.float32)
    head = reduced_head(drafter)
    assert isinstance(head, ReducedHead) and read_meta(reduced_dir).kept == KEEP
    specials = always_kept(tokenizer)  # end and start of sequence
    words = [tokenizer.convert_tokens_to_ids(f"w{k}") for k in range(KEEP - len(specials))]
    assert head.kept_ids.tolist() == sorted(specials + words)
    ids = torch.tensor([[2, 5, 9, 11, 30, 7]])
    with torch.inference_mode():
        rows = drafter(ids).logits[0]
        full = drafter.__dict__["_polyspec_full_head"](drafter.model(ids).last_hidden_state)[0]
    kept = head.kept_ids
    outside = torch.ones(rows.shape[-1], dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(rows[:, outside]).all()  # zero probability outside the kept ids
    torch.testing.assert_close(rows[:, kept], full[:, kept])  # untrained: the full head's rows


def test_top_tokens_weighs_each_corpus_equally(tokenizer):
    big = ["w10 w11 w12"] * 50  # a large corpus ...
    small = ["w20 w20 w20 w21"]  # ... does not crowd out a small one
    kept, info = top_tokens(tokenizer, [big, small], 5, 64)  # the 2 specials and 3 more
    ids = {w: tokenizer.convert_tokens_to_ids(w) for w in ("w10", "w11", "w12", "w20", "w21")}
    assert kept == sorted(always_kept(tokenizer) + [ids["w10"], ids["w11"], ids["w20"]])  # ties: lower id
    assert info == {"corpus_tokens": 154, "distinct_tokens": 5, "kept": 5}


def test_greedy_output_is_identical_with_a_reduced_vocabulary(verifier, reduced_dir):
    decoder = Decoder(verifier)
    drafter = make_drafter(f"distill:{reduced_dir}", verifier)
    accepted = 0
    for prompt in random_prompts(5, seed=4):
        expected = hf_greedy(verifier.model, prompt, 30)
        for gamma in (1, 4):
            result = decoder.generate(prompt, drafter, gamma=gamma, max_new_tokens=30)
            assert result.token_ids == expected, (gamma, prompt)
            accepted += result.stats.accepted
    assert accepted > 0  # the drafts were used


@pytest.mark.slow
def test_sampling_with_a_reduced_vocabulary_follows_the_exact_distribution(verifier, reduced_dir):
    drafter = make_drafter(f"distill:{reduced_dir}", verifier)
    kept = reduced_head(drafter.lm.model).kept_ids
    outside = torch.ones(verifier.vocab_size, dtype=torch.bool)
    outside[kept] = False
    propose = drafter.propose

    def checked(context, k):
        draft = propose(context, k)
        assert draft.probs is not None and float(draft.probs[:, outside].sum()) == 0.0
        torch.testing.assert_close(draft.probs.sum(-1), torch.ones(len(draft)))
        return draft

    drafter.propose = checked
    check_sampling_is_exact(verifier, drafter, trials=400)


def test_input_embeddings_are_shared_with_the_verifier(verifier, reduced_dir, full_dir):
    for path in (reduced_dir, full_dir):
        drafter = make_drafter(f"distill:{path}", verifier).lm.model
        shared = verifier.model.get_input_embeddings().weight
        assert drafter.get_input_embeddings().weight is shared
        if reduced_head(drafter) is None:  # a tied full head follows its embeddings
            assert drafter.get_output_embeddings().weight is shared


def test_bad_drafter_paths_are_user_errors(verifier, tmp_path, tokenizer):
    with pytest.raises(UserError, match="needs a path"):
        make_drafter("distill:", verifier)
    with pytest.raises(UserError, match="does not exist"):
        make_drafter(f"distill:{tmp_path / 'missing'}", verifier)
    plain = save(tiny_gemma(seed=3, layers=2), tokenizer, tmp_path / "plain")
    with pytest.raises(UserError, match="model:PATH"):
        make_drafter(f"distill:{plain}", verifier)


def edited_copy(drafter_dir, tmp_path, **changes):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(drafter_dir, other)
    meta = json.loads((other / "polyspec-drafter.json").read_text())
    (other / "polyspec-drafter.json").write_text(json.dumps({**meta, **changes}))
    return other


def test_a_drafter_for_another_vocabulary_is_refused(verifier, full_dir, tmp_path):
    from polyspec.vocabulary import fingerprint

    assert read_meta(full_dir).vocab_sha256 == fingerprint(verifier.tokenizer).vocab_sha256
    other = edited_copy(full_dir, tmp_path, vocab_sha256="0" * 64)
    with pytest.raises(UserError, match="another vocabulary"):
        make_drafter(f"distill:{other}", verifier)


def test_a_drafter_of_the_earlier_format_says_to_rebuild_it(verifier, full_dir, tmp_path):
    old = edited_copy(full_dir, tmp_path, format=1)
    with pytest.raises(UserError, match="re-run `polyspec distill init`") as error:
        make_drafter(f"distill:{old}", verifier)
    assert "\n" not in str(error.value) and "format 1" in str(error.value)


def test_init_rejects_bad_settings(verifier_dir, tmp_path):
    with pytest.raises(UserError, match="--layers"):
        init_drafter(str(verifier_dir), 9, tmp_path / "a")
    with pytest.raises(UserError, match="corpora"):
        init_drafter(str(verifier_dir), 2, tmp_path / "b", vocab_top=10)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="refusing to overwrite"):
        init_drafter(str(verifier_dir), 2, tmp_path / "busy")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(languages, "_registered", {})
    install_fake_udhr(tmp_path / "home")  # English text for the prompts' side of the vocabulary
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(corpus_lines()), encoding="utf-8")
    languages.register(Language("tst", "Testish", "Latn", corpus=corpus))
    return tmp_path / "home"


def test_cli_init_writes_the_languages_baseline_and_the_bench_finds_it(home, verifier, verifier_dir):
    from polyspec.bench.grid import BenchConfig
    from polyspec.bench.runner import BenchRunner
    from polyspec.distill.store import bench_drafter_dir

    runner = BenchRunner(BenchConfig(languages=("tst",)), verifier, home / "ngram")
    language = languages.get_language("tst")
    with pytest.raises(UserError, match="polyspec distill init --language tst"):
        runner.drafter("draft-baseline", language)
    with pytest.raises(UserError, match="polyspec distill train --language tst --data translation"):
        runner.drafter("distill-task", language)
    args = ["distill", "init", "--verifier", str(verifier_dir), "--language", "tst", "--layers", "2"]
    code, out, err = run_cli(*args, "--vocab-top", "30", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["kept"] == 30 and record["vocab_sources"] == ["language:tst", "language:eng"]
    assert bench_drafter_dir("draft-baseline", language) == home / "distill" / "tst" / "baseline"
    drafter = runner.drafter("draft-baseline", language).lm.model
    assert drafter.config.num_hidden_layers == 2 and reduced_head(drafter).kept_ids.numel() == 30
    code, out, _ = run_cli("distill", "info", str(home / "distill" / "tst" / "baseline"))
    assert code == 0 and json.loads(out)["layers"] == 2
    code, _, err = run_cli("distill", "init", "--verifier", str(verifier_dir))
    assert code == 2 and err.count("\n") == 1 and "--out" in err
