"""The suffix index and its drafter: the suffix array against a brute-force sort, longest matches
and continuation counts against a brute-force search, greedy identity with transformers, exact
sampling, the file, and `polyspec suffix build | stats`."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import SPECIALS, build_tokenizer, check_sampling_is_exact, hf_greedy, run_cli
from scipy import stats

from polyspec.decoding import Decoder
from polyspec.errors import UserError
from polyspec.sampling import LogitsProcessor, SamplingConfig
from polyspec.specs import make_drafter
from polyspec.suffix.array import SEPARATOR, suffix_array
from polyspec.suffix.build import build, token_text
from polyspec.suffix.drafter import SuffixDrafter, SuffixOptions
from polyspec.suffix.index import SuffixIndex, pattern_bytes
from polyspec.suffix.spec import parse_suffix
from polyspec.suffix.storage import load
from polyspec.vocabulary import Fingerprint

# ---------------------------------------------------------------- brute force


def brute_order(text: list[int]) -> list[int]:
    """Positions of the suffixes that start with a token, sorted: each suffix read up to its
    document's separator, the i-th separator as a symbol above all tokens and earlier ones."""
    keys, document = [], 0
    ends = [i for i, t in enumerate(text) if t == SEPARATOR]
    for i, token in enumerate(text):
        if token == SEPARATOR:
            document += 1
            continue
        end = ends[document]
        keys.append(((*text[i:end], (1 << 32) + document), i))
    return [i for _, i in sorted(keys)]


def brute_match(text: list[int], context: list[int], max_length: int, limit: int) -> tuple[int, Counter]:
    """(longest matched length, counts of the next tokens over the sampled occurrences)."""
    order = brute_order(text)
    best, following = 0, Counter()
    for length in range(1, min(len(context), max_length) + 1):
        pattern = context[len(context) - length :]
        found = [p for p in order if text[p : p + length] == pattern and text[p + length] != SEPARATOR]
        if not found:
            break
        best = length
        if len(found) > limit:
            found = [found[(i * len(found)) // limit] for i in range(limit)]
        following = Counter(text[p + length] for p in found)
    return best, following


def random_documents(rng: random.Random, vocab: int, count: int) -> list[list[int]]:
    """Short documents over a few tokens, with repeated stretches so that matches run long."""
    base = [rng.randrange(vocab) for _ in range(12)]
    documents = []
    for _ in range(count):
        if rng.random() < 0.3:
            start = rng.randrange(len(base))
            documents.append(base[start : start + rng.randint(0, 12)])
        else:
            documents.append([rng.randrange(vocab) for _ in range(rng.randint(0, 10))])
    return documents


def index_of(documents: list[list[int]], vocab: int) -> SuffixIndex:
    text = token_text([np.array(d, dtype=np.uint32) for d in documents], [np.array([len(d)]) for d in documents])
    order = suffix_array(text)
    return SuffixIndex(text.astype(">u4").tobytes(), 0, order, Fingerprint(vocab, "0" * 64), len(documents))


# ---------------------------------------------------------------- the array and the queries


@pytest.mark.parametrize("seed", range(40))
def test_suffix_array_equals_a_brute_force_sort(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    text = rng.integers(0, int(rng.integers(1, 6)), n).astype(np.uint32)  # few symbols: long repeats
    if seed % 3 == 0:
        text[:] = text[0]  # one symbol repeated
    text[rng.random(n) < 0.1] = SEPARATOR
    text = np.append(text, np.uint32(SEPARATOR))
    result = suffix_array(text)
    assert result.dtype == np.uint32
    assert result.tolist() == brute_order(text.tolist())


def test_suffix_array_of_repeated_documents():
    text = np.array([3, 4, 3, 4, SEPARATOR] * 50, dtype=np.uint32)
    assert suffix_array(text).tolist() == brute_order(text.tolist())


@pytest.mark.parametrize("seed", range(12))
def test_longest_match_and_counts_equal_a_brute_force_search(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 6])
    documents = random_documents(rng, vocab, rng.choice([30, 120]))  # spans long and short
    index = index_of(documents, vocab)
    text = index.text.tolist()
    for trial in range(25):
        if trial % 2:
            document = rng.choice([d for d in documents if d] or [[0]])
            context = document[: rng.randint(1, len(document))]
        else:
            context = []
        context = [rng.randrange(vocab + 1) for _ in range(rng.randint(0, 6))] + context
        max_length, limit = rng.choice([(32, 256), (3, 256), (32, 4), (5, 3)])
        match = index.longest_match(context, max_length)
        length, expected = brute_match(text, context, max_length, limit)
        assert match.length == length, (context, max_length)
        ids, counts = index.continuations(match, limit)
        if length:
            assert dict(zip(ids.tolist(), counts.tolist(), strict=True)) == dict(expected)
            top = max(expected.values())
            best = min(token for token, count in expected.items() if count == top)
            assert index.most_frequent(match, limit) == (best, pytest.approx(top / sum(expected.values())))
        assert list(ids) == sorted(ids)


@pytest.mark.parametrize("seed", range(6))
def test_extending_a_match_equals_matching_afresh(seed):
    rng = random.Random(seed)
    vocab = 3
    index = index_of(random_documents(rng, vocab, 40), vocab)
    for max_length in (2, 4, 32):
        context: list[int] = []
        match = index.root
        for _ in range(60):
            token = rng.randrange(vocab + 1)  # vocab itself never occurs
            context.append(token)
            match = index.extend(match, pattern_bytes(context[-max_length:]), max_length)
            assert match == index.longest_match(context, max_length)


@pytest.mark.parametrize("seed", range(12))
def test_the_move_found_while_counting_equals_extending(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 6])
    index = index_of(random_documents(rng, vocab, rng.choice([30, 120])), vocab)
    found = 0
    for _ in range(60):
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
        match = index.longest_match(context)
        if match.length == 0:
            continue
        limit = rng.choice([256, 4])
        best, share, moved = index.most_frequent_move(match, limit)
        assert (best, share) == index.most_frequent(match, limit)
        extended = index.extend(match, pattern_bytes([*context[-match.length :], best]))
        if moved is not None:
            found += 1
            assert moved == extended
        else:  # not found on the way only where numpy counted, or where nothing goes on after it
            assert match.hi - match.lo > min(24, limit) or extended.length <= match.length
    assert found


# ---------------------------------------------------------------- building and the file


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("word-tokenizer")
    tokenizer.save_pretrained(path)
    return path


def words(tokenizer, ids: list[int]) -> str:
    return " ".join(tokenizer.convert_ids_to_tokens(ids))


def test_build_writes_what_loads(tokenizer, tmp_path):
    lines = ["w1 w2 w3", "", "w2 w3 w1 w2", "w9"]
    report = build(tokenizer, lines, tmp_path / "i.suffix", metadata={"source": "test"})
    index = load(tmp_path / "i.suffix")
    expected = []
    for line in filter(None, lines):
        expected += [len(SPECIALS) + int(word[1:]) for word in line.split()] + [SEPARATOR]
    assert index.text.tolist() == expected
    assert index.suffix_array.tolist() == brute_order(expected)
    assert (report.tokens, report.documents) == (index.num_tokens, index.documents) == (8, 3)
    assert index.metadata == {"source": "test"} and index.file_size == report.file_size
    assert index.fingerprint.vocab_size == len(tokenizer)


def test_damaged_files_are_user_errors(tokenizer, tmp_path):
    build(tokenizer, ["w1 w2 w3 w4"], tmp_path / "i.suffix")
    data = (tmp_path / "i.suffix").read_bytes()
    (tmp_path / "short.suffix").write_bytes(data[:-3])
    (tmp_path / "other.suffix").write_bytes(b"not an index at all")
    (tmp_path / "empty.suffix").write_bytes(b"")
    (tmp_path / "dir.suffix").mkdir()
    for name, message in [
        ("short", "truncated"),
        ("other", "not a polyspec suffix index"),
        ("empty", "empty"),
        ("dir", "directory"),
        ("absent", "does not exist"),
    ]:
        with pytest.raises(UserError, match=message):
            load(tmp_path / f"{name}.suffix")


def test_an_empty_corpus_is_refused(tokenizer, tmp_path):
    with pytest.raises(UserError, match="no text"):
        build(tokenizer, ["", ""], tmp_path / "i.suffix")


# ---------------------------------------------------------------- the drafter


@pytest.fixture(scope="module")
def index_path(tmp_path_factory, verifier) -> Path:
    """The verifier's own greedy continuations (so drafts are often right) and word salad."""
    decoder = Decoder(verifier)
    rng = random.Random(0)
    lines = []
    for _ in range(12):
        prompt = [rng.randrange(4, 64) for _ in range(4)]
        continuation = decoder.generate([2, *prompt], max_new_tokens=40, eos_token_ids=frozenset()).token_ids
        lines.append(words(verifier.tokenizer, prompt + continuation))
    for _ in range(30):
        lines.append(words(verifier.tokenizer, [rng.randrange(4, 64) for _ in range(rng.randint(1, 12))]))
    path = tmp_path_factory.mktemp("suffix") / "corpus.suffix"
    build(verifier.tokenizer, lines, path)
    return path


def started(drafter, greedy: bool, seed: int = 0):
    config = SamplingConfig() if greedy else SamplingConfig(temperature=1.0)
    drafter.start([2], LogitsProcessor(config), torch.Generator().manual_seed(seed))
    return drafter


def test_spec_grammar():
    assert parse_suffix("a/b.suffix") == ("a/b.suffix", SuffixOptions())
    assert parse_suffix("a/b.suffix+context") == ("a/b.suffix", SuffixOptions(use_context=True))
    for bad in ("", "+context"):
        with pytest.raises(UserError):
            parse_suffix(bad)


@pytest.mark.parametrize("suffix", ["", "+context"])
def test_greedy_identity_with_transformers(verifier, index_path, suffix):
    decoder = Decoder(verifier)
    drafter = make_drafter(f"suffix:{index_path}{suffix}", verifier)
    rng = random.Random(1)
    accepted = 0
    for gamma in (2, 5):
        for _ in range(3):
            prompt = [2, *[rng.randrange(4, 64) for _ in range(rng.randint(1, 8))]]
            result = decoder.generate(prompt, drafter, gamma=gamma, max_new_tokens=30)
            assert result.token_ids == hf_greedy(verifier.model, prompt, 30)
            accepted += result.stats.accepted
    assert accepted > 0  # speculation really happened


def test_greedy_drafts_follow_the_most_frequent_continuation(verifier, index_path):
    drafter = started(make_drafter(f"suffix:{index_path}", verifier), greedy=True)
    index = drafter.index
    text = index.text.tolist()
    rng = random.Random(4)
    drafted = 0
    for _ in range(30):
        context = [2, *[rng.randrange(4, 64) for _ in range(rng.randint(1, 6))]]
        draft = drafter.propose(context, 3)
        drafted += len(draft)
        grown = list(context)
        for token in draft.tokens:
            _, following = brute_match(text, grown[1:], 32, 256)
            top = max(following.values())
            assert token == min(t for t, c in following.items() if c == top)
            grown.append(token)
        if len(draft) < 3:  # it ended because nothing matched
            assert brute_match(text, grown[1:], 32, 256)[0] == 0
    assert drafted > 0


def test_context_drafts_follow_the_live_match_unless_the_corpus_reaches_further(verifier, index_path):
    drafter = started(make_drafter(f"suffix:{index_path}+context", verifier), greedy=True)
    text = drafter.index.text.tolist()
    rng = random.Random(5)
    chose_live = chose_corpus = 0
    for _ in range(40):
        base = [rng.randrange(4, 64) for _ in range(rng.randint(2, 6))]
        context = [
            2,
            *base,
            *base[: rng.randint(0, len(base))],
            *[rng.randrange(4, 64) for _ in range(rng.randint(0, 2))],
        ]
        draft = drafter.propose(context, 1)
        length, following = brute_match(text, context[1:], 32, 256)
        live = None  # the longest earlier occurrence of the context's end, as the live cache sees it
        for n in range(min(7, len(context) - 1), 0, -1):
            seen = Counter(context[i + n] for i in range(len(context) - n) if context[i : i + n] == context[-n:])
            if seen:
                live = n, seen
                break
        top = max(following.values()) if following else 0
        corpus_wins = live is None or min(length, 7) > live[0]  # the live cache reaches 7 tokens
        if following and corpus_wins:
            assert draft.tokens == [min(t for t, c in following.items() if c == top)]
            chose_corpus += 1
        elif live is not None:
            assert draft.tokens[0] in {t for t, c in live[1].items() if c == max(live[1].values())}
            chose_live += 1
    assert chose_live and chose_corpus  # both sides of the rule were exercised


@pytest.mark.parametrize("greedy", [True, False])
def test_bounding_the_live_match_drafts_what_a_full_search_drafts(verifier, index_path, greedy):
    """Each drafted token starts the live look-up one above the last match: the same drafts (and
    draft rows) as looking up every length each time."""
    bounded = started(make_drafter(f"suffix:{index_path}+context", verifier), greedy=greedy)
    full = started(make_drafter(f"suffix:{index_path}+context", verifier), greedy=greedy)
    choose = full._choose
    full._choose = lambda match, live, bound: choose(match, live, full.cache.max_context)
    rng = random.Random(8)
    drafted = 0
    for _ in range(30):
        base = [rng.randrange(4, 64) for _ in range(rng.randint(3, 8))]
        context = [2, *base, *[rng.randrange(4, 64) for _ in range(2)], *base[: rng.randint(1, len(base))]]
        started(bounded, greedy, seed=1), started(full, greedy, seed=1)  # fresh caches, the same draws
        ours, theirs = bounded.propose(context, 6), full.propose(context, 6)
        assert ours.tokens == theirs.tokens
        assert (ours.probs is None) == (theirs.probs is None)
        if ours.probs is not None:
            assert torch.equal(ours.probs, theirs.probs)
        drafted += len(ours.tokens)
    assert drafted > 30


def test_sampled_drafts_are_proper_distributions(verifier, index_path):
    drafter = started(make_drafter(f"suffix:{index_path}+context", verifier), greedy=False)
    rng = random.Random(2)
    drafted = 0
    for _ in range(20):
        context = [2, *[rng.randrange(4, 64) for _ in range(rng.randint(1, 10))]]
        draft = drafter.propose(context, 4)
        drafted += len(draft)
        if not draft.tokens:
            continue
        assert draft.probs.shape == (len(draft), verifier.vocab_size) and draft.probs.dtype == torch.float32
        assert torch.all(draft.probs >= 0)
        torch.testing.assert_close(draft.probs.sum(dim=1), torch.ones(len(draft)), atol=1e-5, rtol=0)
        for token, row in zip(draft.tokens, draft.probs, strict=True):
            assert row[token] > 0
    assert drafted > 20


def test_sampled_tokens_follow_the_draft_rows(verifier, index_path):
    """Draws over many seeds match the row the drafter reports (chi-square)."""
    drafter = make_drafter(f"suffix:{index_path}", verifier)
    index = drafter.index
    tokens = index.text[index.text != SEPARATOR]
    context = [2, int(np.bincount(tokens).argmax())]  # the most frequent token
    draws, row = Counter(), None
    for seed in range(1500):
        draft = started(drafter, greedy=False, seed=seed).propose(context, 1)
        draws[draft.tokens[0]] += 1
        row = draft.probs[0] if row is None else row
        assert torch.equal(draft.probs[0], row)
    support = row.nonzero().flatten().tolist()
    assert len(support) > 1 and set(draws) <= set(support)
    observed = np.array([draws[t] for t in support], dtype=float)
    expected = row[support].double().numpy()
    assert stats.chisquare(observed, expected / expected.sum() * observed.sum()).pvalue > 1e-3


@pytest.mark.parametrize("suffix", ["", "+context"])
def test_sampled_output_is_exact_with_the_suffix_drafter(verifier, index_path, suffix):
    check_sampling_is_exact(verifier, make_drafter(f"suffix:{index_path}{suffix}", verifier), trials=500)


def test_tokenizer_mismatch_is_refused(verifier, tmp_path):
    other = build_tokenizer()
    other.add_tokens(["extra-word"])
    build(other, ["w1 w2 w3"], tmp_path / "other.suffix")
    with pytest.raises(UserError, match="another tokenizer"):
        make_drafter(f"suffix:{tmp_path / 'other.suffix'}", verifier)


def test_the_drafter_takes_an_index_object(verifier):
    index = index_of([[5, 6, 7, 8], [5, 6, 9]], verifier.vocab_size)
    drafter = started(SuffixDrafter(index, verifier.vocab_size), greedy=True)
    assert drafter.propose([2, 5, 6], 4).tokens == [7, 8]  # the tie 7/9 goes to the smaller id
    assert drafter.propose([2, 5, 6, 9], 4).tokens == []  # nothing follows 9 in the corpus
    assert drafter.propose([2, 11], 4).tokens == []  # 11 never occurs


def test_tokens_the_verifier_cannot_emit_are_never_drafted(verifier):
    # 40 follows 5 most often, but a verifier of 30 tokens cannot emit it: the next best is drafted
    index = index_of([[5, 40], [5, 40], [5, 7]], verifier.vocab_size)
    assert started(SuffixDrafter(index, 30), greedy=True).propose([2, 5], 1).tokens == [7]
    assert started(SuffixDrafter(index, 30), greedy=False).propose([2, 5], 1).tokens == [7]


# ---------------------------------------------------------------- the command line


def test_cli_build_and_stats(tokenizer_dir, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"body": f"w1 w2 w{i}"}) for i in range(5)) + "\n", encoding="utf-8")
    out = tmp_path / "c.suffix"
    args = ("suffix", "build", "--tokenizer", str(tokenizer_dir), "--out", str(out), "--corpus", str(corpus))
    code, stdout, stderr = run_cli(*args, "--text-field", "body", "--no-progress", "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    assert (report["tokens"], report["documents"]) == (15, 5)
    code, stdout, stderr = run_cli("suffix", "stats", str(out), "--json")
    assert code == 0, stderr
    info = json.loads(stdout)
    assert (info["tokens"], info["documents"], info["file_size"]) == (15, 5, out.stat().st_size)
    assert info["metadata"]["corpus"][0]["file"] == str(corpus)
    assert len(info["metadata"]["corpus"][0]["sha256"]) == 64
    code, stdout, _ = run_cli("suffix", "stats", str(out))
    assert code == 0 and "15 tokens in 5 documents" in stdout


@pytest.mark.parametrize(
    "case",
    ["missing corpus", "no such output dir", "bad jsonl", "empty corpus", "stats on a text file", "stats missing"],
)
def test_cli_bad_inputs_exit_2(tokenizer_dir, tmp_path, case):
    good = tmp_path / "good.txt"
    good.write_text("w1 w2\n", encoding="utf-8")
    (tmp_path / "bad.jsonl").write_text("{not json\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    build_args = ["suffix", "build", "--tokenizer", str(tokenizer_dir), "--no-progress", "--out"]
    args = {
        "missing corpus": [*build_args, str(tmp_path / "o.suffix"), "--corpus", str(tmp_path / "absent.txt")],
        "no such output dir": [*build_args, str(tmp_path / "no" / "o.suffix"), "--corpus", str(good)],
        "bad jsonl": [*build_args, str(tmp_path / "o.suffix"), "--corpus", str(tmp_path / "bad.jsonl")],
        "empty corpus": [*build_args, str(tmp_path / "o.suffix"), "--corpus", str(tmp_path / "empty.txt")],
        "stats on a text file": ["suffix", "stats", str(good)],
        "stats missing": ["suffix", "stats", str(tmp_path / "absent.suffix")],
    }[case]
    code, _, stderr = run_cli(*args)
    assert code == 2
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.suffix").exists()
