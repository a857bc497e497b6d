"""The Python API: polyspec.Engine, its streams, polyspec.generate, the drafters' public names and
the incremental detokeniser, on tiny random models."""

from __future__ import annotations

import random
import subprocess
import sys
import threading

import pytest
import torch
from fixtures import SPECIALS, VOCAB_WORDS, build_tokenizer, tiny_gemma

import polyspec
from polyspec.drafters import DraftModel, NGram, PromptLookup
from polyspec.errors import UserError
from polyspec.models import LoadedModel
from polyspec.streaming import REPLACEMENT, TextStream, cut_at_stop

PROMPTS = ["w1 w2 w3 w4 w1 w2", "w5 w6 w7 w5 w6 w7 w5", "w10 w11 w12 w13 w14 w15 w10 w11", "w20 w3 w20 w3"]
# Multi-byte text: Amharic, Cherokee, Chinese, a mathematical letter (4 bytes), ASCII.
SCRIPTS = "ab ሰላም ለዓለም 你好世界 ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ 𝔘𝔫𝔦 END. ሰ你 dab"


@pytest.fixture(scope="module")
def model():
    return tiny_gemma(seed=1)


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    return polyspec.Engine(model=model, tokenizer=tokenizer, name="tiny")


def reference(model, tokenizer, prompt: str, max_new_tokens: int, **kwargs) -> list[int]:
    ids = tokenizer(prompt)["input_ids"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0, len(ids) :].tolist()


def byte_tokenizer():
    """A SentencePiece-like tokenizer with byte fallback: characters outside its small vocabulary
    become one token per UTF-8 byte, so one character spans two to four tokens; its decoder
    strips the first space, as Llama's does."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for piece in ["▁", "a", "b", "c", "d", "E", "N", "D", ".", "ሰ", "你"]:
        vocab[piece] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>", fuse_unk=False))
    core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    core.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def stream_in_pieces(tokenizer, ids, stops=(), seed=0, most=4) -> tuple[list[str], TextStream]:
    rng = random.Random(seed)
    stream = TextStream(tokenizer, stops)
    pieces, i = [], 0
    while i < len(ids) and not stream.stopped:
        k = rng.randint(1, most)
        pieces.append(stream.push(ids[i : i + k]))
        i += k
    pieces.append(stream.finish())
    return pieces, stream


# -- the package -------------------------------------------------------------------------------


def test_import_is_cheap_and_public_names_resolve():
    code = "import sys, polyspec; print('torch' in sys.modules); print(sorted(polyspec.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    torch_loaded, names = out.stdout.splitlines()
    assert torch_loaded == "False"
    for name in eval(names):
        assert getattr(polyspec, name) is not None, name
    assert polyspec.Engine.__module__ == "polyspec.api"
    assert polyspec.drafters.NGram is NGram
    with pytest.raises(AttributeError):
        polyspec.no_such_name  # noqa: B018


# -- losslessness ------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_matches_transformers_for_every_drafter(engine, model, tokenizer, draft_dir, gamma):
    draft = DraftModel.load(str(draft_dir), engine)
    drafters = ["none", "prompt-lookup", PromptLookup(1, 2), draft]
    for prompt in PROMPTS:
        expected = reference(model, tokenizer, prompt, 24)
        for drafter in drafters:
            out = engine.generate(prompt, drafter=drafter, max_new_tokens=24, gamma=gamma)
            assert out.token_ids == expected, (prompt, drafter)
            assert out.text == tokenizer.decode(expected, skip_special_tokens=True)


def test_engine_loads_a_path_and_repetition_penalty_matches(verifier_dir, model, tokenizer):
    engine = polyspec.Engine(str(verifier_dir), dtype="float32")
    assert engine.name == str(verifier_dir)
    for prompt in PROMPTS[:2]:
        expected = reference(model, tokenizer, prompt, 20, repetition_penalty=1.3)
        out = engine.generate(prompt, drafter="prompt-lookup", max_new_tokens=20, repetition_penalty=1.3)
        assert out.token_ids == expected


def test_engine_takes_a_loaded_model(verifier, model, tokenizer):
    engine = polyspec.Engine(verifier)
    assert engine.verifier is verifier
    prompt = PROMPTS[0]
    assert engine.generate(prompt, max_new_tokens=12).token_ids == reference(model, tokenizer, prompt, 12)


def test_ngram_trained_from_python_drafts_losslessly(tmp_path, engine, model, tokenizer):
    rng = random.Random(3)
    documents = [" ".join(f"w{rng.randrange(VOCAB_WORDS)}" for _ in range(40)) for _ in range(30)]
    documents += [PROMPTS[0] + " w3 w4 w1 w2 w3 w4"] * 5
    path = tmp_path / "tiny.ngram"
    polyspec.ngram.train(tokenizer, documents, order=3, out=path, show_progress=False)
    drafter = NGram(polyspec.ngram.load(path), engine, context=True)
    assert isinstance(drafter, polyspec.drafters.NGramDrafter)
    by_spec = engine.drafter(f"ngram:{path}+context")
    assert engine.drafter(f"ngram:{path}+context") is by_spec  # built once per spec
    for prompt in PROMPTS:
        expected = reference(model, tokenizer, prompt, 20)
        out = engine.generate(prompt, drafter=drafter, max_new_tokens=20)  # one object, many calls
        assert out.token_ids == expected
        assert engine.generate(prompt, drafter=by_spec, max_new_tokens=20).token_ids == expected
    assert out.stats.drafted > 0


def test_drafters_refuse_another_vocabulary(tmp_path, engine, draft_dir):
    other = build_tokenizer()
    other.add_tokens(["extra"])
    draft = LoadedModel.load(str(draft_dir), dtype="float32")
    with pytest.raises(UserError, match="another tokenizer"):
        DraftModel(draft.model, engine, tokenizer=other)
    with pytest.raises(UserError, match="drafts over"):
        engine.generate(PROMPTS[0], drafter=_WideDrafter(), max_new_tokens=4)


class _WideDrafter:
    vocab_size = 10_000

    def start(self, prompt_ids, processor, generator):
        pass

    def propose(self, context, k):
        raise AssertionError("never called")


# -- streaming ---------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_stream_equals_generate(engine, tokenizer, drafter):
    for prompt in PROMPTS:
        for options in ({}, {"temperature": 0.9, "top_p": 0.9, "seed": 5}):
            out = engine.generate(prompt, drafter=drafter, max_new_tokens=30, **options)
            stream = engine.stream(prompt, drafter=drafter, max_new_tokens=30, **options)
            chunks = list(stream.chunks())
            assert "".join(c.text for c in chunks) == out.text == stream.generation.text
            assert [t for c in chunks for t in c.token_ids] == out.token_ids == stream.generation.token_ids
            assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
            assert stream.generation.stats.verifier_calls == len([c for c in chunks if c.token_ids])


def test_sampling_is_seeded_and_do_sample_follows_transformers(engine):
    prompt = PROMPTS[1]
    first = engine.generate(prompt, max_new_tokens=30, temperature=1.0, seed=11)
    assert engine.generate(prompt, max_new_tokens=30, temperature=1.0, seed=11).token_ids == first.token_ids
    greedy = engine.generate(prompt, max_new_tokens=30)
    assert engine.generate(prompt, max_new_tokens=30, temperature=1.0, do_sample=False).token_ids == greedy.token_ids
    sampled = {tuple(engine.generate(prompt, max_new_tokens=30, do_sample=True, seed=s).token_ids) for s in range(4)}
    assert len(sampled) > 1


def test_stop_strings_across_chunks(engine, tokenizer):
    prompt = PROMPTS[2]
    full = engine.generate(prompt, max_new_tokens=40)
    words = full.text.split(" ")
    assert len(words) > 8
    for start in (2, 5):
        stop = " ".join(words[start : start + 2])  # two tokens: each chunk of plain decoding holds one
        expected = full.text[: full.text.index(stop)]
        stream = engine.stream(prompt, max_new_tokens=40, stop_strings=[stop])
        seen = ""
        for piece in stream:
            seen += piece
            assert stop not in seen
            assert expected.startswith(seen)  # nothing past the stop, nothing taken back
        assert seen == expected == stream.generation.text
        assert stream.generation.stop_reason == "stop_string"
        ids = stream.generation.token_ids
        assert stop in tokenizer.decode(ids) and stop not in tokenizer.decode(ids[:-1])
        assert engine.generate(prompt, max_new_tokens=40, stop_strings=stop).text == expected


def test_closing_a_stream_frees_the_engine(engine, model, tokenizer):
    stream = engine.stream(PROMPTS[0], max_new_tokens=50)
    next(stream)
    assert engine.busy
    stream.close()
    assert not engine.busy and stream.generation is None
    prompt = PROMPTS[3]
    assert engine.generate(prompt, max_new_tokens=10).token_ids == reference(model, tokenizer, prompt, 10)


def test_one_generation_at_a_time(engine, model, tokenizer):
    open_stream = engine.stream(PROMPTS[0], max_new_tokens=20)
    next(open_stream)
    with pytest.raises(UserError, match="already generating"):
        engine.generate(PROMPTS[1], max_new_tokens=5)
    open_stream.close()
    results: dict[str, list[int]] = {}

    def run(prompt):
        results[prompt] = engine.generate(prompt, drafter="prompt-lookup", max_new_tokens=25).token_ids

    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {p: reference(model, tokenizer, p, 25) for p in PROMPTS}


def markov_gemma(successor: dict[int, int], vocab_size: int, seed: int = 5):
    """A tiny Gemma 3 whose greedy next token depends on the current token alone, as `successor`
    says: attention and MLP outputs are zeroed, so the last hidden state is the normalised
    embedding of the current token, and the output row of each successor is that embedding."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        head.zero_()
        for token, following in successor.items():
            head[following] = 10 * embeddings[token] / embeddings[token].norm()
    return model


def test_multibyte_scripts_stream_cleanly_end_to_end():
    """Greedy output that cycles through characters of two to four byte tokens each (Cherokee,
    a mathematical letter, Cyrillic) between one-token characters (Latin, Chinese, Amharic)."""
    tokenizer = byte_tokenizer()
    cycle_text = "aᏣb𝔘cЖd你ሰ"
    cycle = tokenizer(cycle_text, add_special_tokens=False)["input_ids"]
    assert len(set(cycle)) == len(cycle) > len(cycle_text) + 4  # distinct tokens, characters span several
    successor = {token: cycle[(i + 1) % len(cycle)] for i, token in enumerate(cycle)}
    model = markov_gemma(successor, len(tokenizer))
    engine = polyspec.Engine(model=model, tokenizer=tokenizer)
    prompt = cycle[:2]  # "▁a"
    out = engine.generate(prompt, max_new_tokens=60)
    expected_ids = [cycle[(2 + i) % len(cycle)] for i in range(60)]
    assert out.token_ids == expected_ids  # the model does cycle
    assert out.text == tokenizer.decode(expected_ids) and REPLACEMENT not in out.text
    for drafter in ("none", "prompt-lookup"):
        for stops in ((), ("𝔘cЖ",), ("Ж", "你ሰaᏣb𝔘")):
            stream = engine.stream(prompt, drafter=drafter, max_new_tokens=60, stop_strings=stops)
            pieces = list(stream)
            assert all(REPLACEMENT not in piece for piece in pieces), pieces
            assert "".join(pieces) == cut_at_stop(out.text, stops) == stream.generation.text
            assert stops or len(pieces) > 10


def test_engine_refuses_bad_arguments(engine, model):
    with pytest.raises(UserError, match="tokenizer"):
        polyspec.Engine(model=model)
    with pytest.raises(UserError, match="context"):
        engine.generate(PROMPTS[0], max_new_tokens=600)
    with pytest.raises(UserError, match="temperature"):
        engine.stream(PROMPTS[0], temperature=-1)
    with pytest.raises(UserError, match="unknown drafter"):
        engine.generate(PROMPTS[0], drafter="bogus")
    with pytest.raises(UserError, match="empty"):
        engine.generate([])
    with pytest.raises(UserError, match="token ids"):
        engine.generate([5, 9999])


# -- the detokeniser ---------------------------------------------------------------------------


def test_detokeniser_never_splits_a_character():
    tokenizer = byte_tokenizer()
    ids = tokenizer(SCRIPTS, add_special_tokens=False)["input_ids"]
    assert any(tokenizer.decode([i]) == REPLACEMENT for i in ids)  # some characters span tokens
    for seed in range(50):
        pieces, _ = stream_in_pieces(tokenizer, ids, seed=seed)
        assert all(REPLACEMENT not in piece for piece in pieces)
        assert "".join(pieces) == tokenizer.decode(ids) == SCRIPTS


def test_detokeniser_stops_before_stop_strings_split_over_tokens():
    tokenizer = byte_tokenizer()
    ids = tokenizer(SCRIPTS, add_special_tokens=False)["input_ids"]
    for stops in [("END",), ("ለዓ",), ("𝔫𝔦",), ("xyz", "你好"), ("Ꭹ Ꭶ",), (" d",), ("absent",)]:
        expected = cut_at_stop(SCRIPTS, stops)
        for seed in range(20):
            pieces, stream = stream_in_pieces(tokenizer, ids, stops, seed=seed)
            emitted = ""
            for piece in pieces:
                emitted += piece
                assert expected.startswith(emitted)
            assert emitted == expected
            assert stream.stopped == (expected != SCRIPTS)


def test_detokeniser_holds_back_a_possible_stop_string(tokenizer):
    stream = TextStream(tokenizer, ["w2 w3"])
    w = {f"w{i}": tokenizer.convert_tokens_to_ids(f"w{i}") for i in range(6)}
    assert stream.push([w["w1"]]) == "w1"
    assert stream.push([w["w2"]]) == " "  # "w2" may begin the stop string
    assert stream.push([w["w4"]]) == "w2 w4"  # it did not
    assert stream.push([w["w2"], w["w3"], w["w5"]]) == " "  # it did: nothing at or after it
    assert stream.stopped and stream.stop_string == "w2 w3" and stream.text == "w1 w2 w4 "
    assert stream.push([w["w1"]]) == "" and stream.finish() == ""
    unfinished = TextStream(tokenizer, ["w2 w3"])
    assert unfinished.push([w["w1"], w["w2"]]) == "w1 "
    assert unfinished.finish() == "w2"  # the end: what was held back was not a stop string


@pytest.mark.integration
def test_detokeniser_on_the_embedded_tokenizer():
    from polyspec.specs import load_tokenizer

    try:
        tokenizer = load_tokenizer("gemma3-270m")
    except UserError:
        pytest.skip("the embedded verifier is not fetched")
    ids = tokenizer(SCRIPTS, add_special_tokens=False)["input_ids"]
    assert any(tokenizer.decode([i]) == REPLACEMENT for i in ids)  # 𝔘 is four byte tokens
    for seed in range(10):
        pieces, _ = stream_in_pieces(tokenizer, ids, ("𝔫𝔦",), seed=seed)
        assert all(REPLACEMENT not in piece for piece in pieces)
        assert "".join(pieces) == cut_at_stop(SCRIPTS, ["𝔫𝔦"])


# -- polyspec.generate -------------------------------------------------------------------------


def test_generate_takes_model_generate_arguments(model, tokenizer):
    for prompt in PROMPTS:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        for kwargs in ({"max_new_tokens": 15}, {"max_new_tokens": 12, "repetition_penalty": 1.2}, {}):
            expected = model.generate(ids, do_sample=False, **kwargs)
            got = polyspec.generate(model, tokenizer, ids, drafter="prompt-lookup", do_sample=False, **kwargs)
            assert torch.equal(got, expected), (prompt, kwargs)
    text = polyspec.generate(model, tokenizer, PROMPTS[0], max_new_tokens=8)
    assert text.shape == (1, len(tokenizer(PROMPTS[0])["input_ids"]) + 8)
    torch.manual_seed(0)
    a = polyspec.generate(model, tokenizer, ids, do_sample=True, max_new_tokens=10, top_k=0)
    torch.manual_seed(0)
    assert torch.equal(a, polyspec.generate(model, tokenizer, ids, do_sample=True, max_new_tokens=10, top_k=0))


def test_generate_streams_to_a_transformers_streamer(model, tokenizer):
    from transformers import TextIteratorStreamer

    ids = torch.tensor([tokenizer(PROMPTS[1])["input_ids"]])
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    out = polyspec.generate(model, tokenizer, ids, max_new_tokens=12, streamer=streamer)
    assert "".join(streamer).strip() == tokenizer.decode(out[0, ids.shape[1] :]).strip()


def test_generate_refuses_what_it_cannot_do(model, tokenizer):
    ids = torch.tensor([tokenizer(PROMPTS[0])["input_ids"]] * 2)
    with pytest.raises(UserError, match="one sequence"):
        polyspec.generate(model, tokenizer, ids, max_new_tokens=4)
    with pytest.raises(UserError, match="num_beams"):
        polyspec.generate(model, tokenizer, ids[:1], max_new_tokens=4, num_beams=2)
    with pytest.raises(UserError, match="padded"):
        polyspec.generate(model, tokenizer, ids[:1], attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1, 1]]))
