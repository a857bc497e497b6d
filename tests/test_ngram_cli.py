"""`polyspec ngram train | top | stats | verify | convert | merge`: corpus formats, counts, JSON
contracts, errors."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from fixtures import SPECIALS, VOCAB_WORDS, run_cli

from polyspec.ngram.storage import load

LINES = [
    "w1 w2 w3 w4",
    "w1 w2 w3 w5",
    "",
    "w1 w2 w5",
    "w2 w3 w4 w4 w4",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("word-tokenizer")
    tokenizer.save_pretrained(path)
    return path


def ids(line: str) -> list[int]:
    return [len(SPECIALS) + int(word[1:]) for word in line.split()]


def brute_force(lines: list[str], order: int) -> dict[tuple[int, ...], int]:
    counts: Counter = Counter()
    for line in lines:
        document = ids(line)
        for n in range(1, order + 1):
            for i in range(len(document) - n + 1):
                counts[tuple(document[i : i + n])] += 1
    return dict(counts)


def train_cli(tokenizer_dir, out: Path, *corpus_args: str, order: int = 3) -> dict:
    code, stdout, stderr = run_cli("ngram", "train", "--tokenizer", str(tokenizer_dir), "--order", str(order),
        "--out", str(out), "--no-progress", "--json", "--corpus", *corpus_args,
    )  # fmt: skip
    assert code == 0, stderr
    return json.loads(stdout)


def write_corpora(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    text = "\n".join(LINES) + "\n"
    jsonl = "\n".join(json.dumps({"text": line, "id": i}) for i, line in enumerate(LINES) if line)
    paths = {
        "txt": root / "a.txt",
        "gz": root / "a.txt.gz",
        "jsonl": root / "a.jsonl",
        "jsonl.gz": root / "a.jsonl.gz",
        "tsv": root / "a.tsv",
    }
    paths["txt"].write_text(text.replace("\n", "\r\n", 1), encoding="utf-8")  # one CRLF line too
    paths["gz"].write_bytes(gzip.compress(text.encode()))
    paths["jsonl"].write_text(jsonl + "\n", encoding="utf-8")
    paths["jsonl.gz"].write_bytes(gzip.compress(jsonl.encode()))
    paths["tsv"].write_text("id\tsentence\n" + "".join(f"{i}\t{line}\n" for i, line in enumerate(LINES)))
    return paths


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("txt", []), ("gz", []), ("jsonl", []), ("jsonl.gz", []), ("tsv", ["--column", "sentence"])],
)
def test_train_counts_every_format(tmp_path, tokenizer_dir, kind, extra):
    corpus = write_corpora(tmp_path / "corpus")[kind]
    out = tmp_path / "m.ngram"
    report = train_cli(tokenizer_dir, out, str(corpus), *extra)
    assert load(out).to_trie().to_dict() == brute_force(LINES, 3)
    assert report["documents"] == 4 and report["tokens"] == sum(len(ids(line)) for line in LINES)
    expected = brute_force(LINES, 3)
    assert report["ngrams"] == [sum(1 for g in expected if len(g) == n) for n in (1, 2, 3)]
    assert report["file_size"] == out.stat().st_size


def test_train_reads_directories_and_several_files(tmp_path, tokenizer_dir):
    paths = write_corpora(tmp_path / "corpus")
    (tmp_path / "corpus" / "notes.md").write_text("w9 w9 w9\n")  # not a corpus file: skipped
    out = tmp_path / "m.ngram"
    train_cli(tokenizer_dir, out, str(tmp_path / "corpus"), "--column", "sentence")
    expected = Counter()
    for _ in paths:  # five files hold the same documents
        expected.update(brute_force(LINES, 3))
    assert load(out).to_trie().to_dict() == dict(expected)
    train_cli(tokenizer_dir, out, str(paths["txt"]), str(paths["gz"]))
    assert load(out).to_trie().to_dict() == {g: 2 * c for g, c in brute_force(LINES, 3).items()}


def test_jsonl_text_field(tmp_path, tokenizer_dir):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"body": line}) + "\n" for line in LINES), encoding="utf-8")
    out = tmp_path / "m.ngram"
    train_cli(tokenizer_dir, out, str(corpus), "--text-field", "body")
    assert load(out).to_trie().to_dict() == brute_force(LINES, 3)


def test_min_count_prunes(tmp_path, tokenizer_dir):
    corpus = write_corpora(tmp_path / "corpus")["txt"]
    out = tmp_path / "m.ngram"
    train_cli(tokenizer_dir, out, str(corpus), "--min-count", "2")
    expected = {g: c for g, c in brute_force(LINES, 3).items() if len(g) == 1 or c >= 2}
    assert load(out).to_trie().to_dict() == expected


def test_merge_equals_training_on_the_concatenation(tmp_path, tokenizer_dir):
    first, second, both = tmp_path / "1.txt", tmp_path / "2.txt", tmp_path / "both.txt"
    more = ["w7 w8 w1 w2", "w1 w2 w3 w3", "w9"]
    first.write_text("\n".join(LINES) + "\n")
    second.write_text("\n".join(more) + "\n")
    both.write_text("\n".join(LINES + more) + "\n")
    for name, corpus in (("1", first), ("2", second), ("both", both)):
        train_cli(tokenizer_dir, tmp_path / f"{name}.ngram", str(corpus), order=4)
    code, out, err = run_cli("ngram", "merge", str(tmp_path / "1.ngram"), str(tmp_path / "2.ngram"),
        "--out", str(tmp_path / "merged.ngram"), "--json",
    )  # fmt: skip
    assert code == 0, err
    merged, trained = load(tmp_path / "merged.ngram"), load(tmp_path / "both.ngram")
    assert merged.to_trie().to_dict() == trained.to_trie().to_dict()
    assert (merged.num_tokens, merged.documents) == (trained.num_tokens, trained.documents)
    assert json.loads(out)["ngrams_per_order"] == {str(n + 1): c for n, c in enumerate(trained.ngram_counts())}


@pytest.fixture()
def bigram_model(tmp_path, tokenizer_dir) -> Path:
    corpus = write_corpora(tmp_path / "corpus")["txt"]
    out = tmp_path / "bigram.ngram"
    train_cli(tokenizer_dir, out, str(corpus), order=2)
    return out


def test_top_json_is_the_maximum_likelihood_estimate(bigram_model):
    counts = brute_force(LINES, 2)
    for a in sorted({g[0] for g in counts if len(g) == 2}):
        code, out, _ = run_cli("ngram", "top", "--model", str(bigram_model), "--context-ids", f"7,{a}",
            "--k", "5", "--json", "--backoff", "none",
        )  # fmt: skip
        assert code == 0
        candidates = json.loads(out)["candidates"]
        following = {g[1]: c for g, c in counts.items() if len(g) == 2 and g[0] == a}
        total = sum(following.values())
        assert [c["token_id"] for c in candidates] == sorted(following, key=lambda t: (-following[t], t))
        for candidate in candidates:
            assert set(candidate) == {"token_id", "prob", "count", "order"}
            assert candidate["count"] == following[candidate["token_id"]]
            assert candidate["prob"] == pytest.approx(candidate["count"] / total)
            assert candidate["order"] == 2


def test_top_backs_off_and_reports_the_order(bigram_model):
    unseen = len(SPECIALS) + VOCAB_WORDS - 1  # w59 never occurs
    code, out, _ = run_cli("ngram", "top", "--model", str(bigram_model), "--context-ids", str(unseen), "--json")
    assert code == 0
    candidates = json.loads(out)["candidates"]
    assert [c["order"] for c in candidates] == [1] * 5
    assert candidates[0]["token_id"] == ids("w2")[0]  # the most frequent word
    code, out, _ = run_cli("ngram", "top", "--model", str(bigram_model), "--context-ids", str(unseen),
        "--backoff", "none", "--json",
    )  # fmt: skip
    assert json.loads(out) == {"candidates": []}


def test_stats_json(bigram_model, tokenizer_dir):
    code, out, _ = run_cli("ngram", "stats", str(bigram_model), "--json")
    assert code == 0
    info = json.loads(out)
    counts = brute_force(LINES, 2)
    assert info["order"] == 2
    assert info["vocab_size"] == len(SPECIALS) + VOCAB_WORDS
    assert info["ngrams_per_order"] == {"1": 5, "2": sum(1 for g in counts if len(g) == 2)}
    assert info["tokens"] == sum(len(ids(line)) for line in LINES)
    assert info["file_size"] == bigram_model.stat().st_size
    (source,) = info["metadata"]["corpus"]
    corpus = Path(source["file"])
    assert source["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert info["metadata"]["tokenizer"] == str(tokenizer_dir)
    code, out, _ = run_cli("ngram", "stats", str(bigram_model))
    assert code == 0 and f"corpus {corpus} ({corpus.stat().st_size:,} bytes, sha256 {source['sha256']})" in out


def test_verify_and_convert(tmp_path, bigram_model):
    from fixtures import write_version1

    code, out, _ = run_cli("ngram", "verify", str(bigram_model))
    assert code == 0 and "ok" in out and load(bigram_model).data_sha256 in out
    old, new = tmp_path / "old.ngram", tmp_path / "new.ngram"
    write_version1(load(bigram_model).to_trie(), load(bigram_model).fingerprint, old)
    code, _, err = run_cli("ngram", "stats", str(old))
    assert code == 2 and f"polyspec ngram convert {old} --out" in err
    code, out, err = run_cli("ngram", "convert", str(old), "--out", str(new))
    assert code == 0, err
    assert load(new).to_trie().to_dict() == load(bigram_model).to_trie().to_dict()
    code, _, err = run_cli("ngram", "convert", str(bigram_model), "--out", str(new))
    assert code == 2 and "format version 1" in err


def test_generate_with_the_ngram_drafter(verifier, verifier_dir, bigram_model):
    prompt = "w1 w2 w3 w4 w1 w2"
    code, out, err = run_cli("generate", "--verifier", str(verifier_dir), "--drafter",
        f"ngram:{bigram_model}+context?min_prob=0.1", "--prompt", prompt, "--max-new-tokens", "20",
        "--dtype", "float32", "--json",
    )  # fmt: skip
    assert code == 0, err
    prompt_ids = verifier.tokenizer(prompt)["input_ids"]
    expected = verifier.model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=20, pad_token_id=0)
    assert json.loads(out)["token_ids"] == expected[0, len(prompt_ids) :].tolist()


def polyspec(*args: str) -> subprocess.CompletedProcess:
    executable = Path(sys.executable).with_name("polyspec")
    return subprocess.run([str(executable), *args], capture_output=True, text=True, timeout=120)


def assert_user_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert fragment in lines[0]


def test_errors_are_one_line_with_exit_code_2(tmp_path, tokenizer_dir, bigram_model):
    damaged = tmp_path / "damaged.ngram"
    data = bigram_model.read_bytes()
    damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # the last byte of the data
    assert_user_error(polyspec("ngram", "verify", str(damaged)), "data checksum mismatch")
    header = data.replace(b'"order":"2"', b'"order":"3"')
    assert header != data
    damaged.write_bytes(header)
    assert_user_error(polyspec("ngram", "stats", str(damaged)), "header checksum mismatch")
    assert_user_error(polyspec("ngram", "top", "--model", str(bigram_model), "--context-ids", "1,x"), "context ids")
    assert_user_error(
        polyspec("ngram", "train", "--tokenizer", str(tokenizer_dir), "--corpus", str(tmp_path / "missing.txt"),
                 "--out", str(tmp_path / "x.ngram")),
        "does not exist",
    )  # fmt: skip


def test_in_process_errors(tmp_path, tokenizer_dir, bigram_model):
    code, _, err = run_cli("ngram", "top", "--model", str(tmp_path / "none.ngram"))
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli("ngram", "train", "--tokenizer", str(tokenizer_dir), "--corpus", str(bigram_model),
        "--order", "9", "--out", str(tmp_path / "x.ngram"),
    )  # fmt: skip
    assert code == 2 and "order must be between 1 and 8" in err
    code, _, err = run_cli("ngram", "top", "--model", str(bigram_model), "--backoff", "maybe")
    assert code == 2 and "backoff" in err
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "w1 w2"}\n{oops\n')
    code, _, err = run_cli("ngram", "train", "--tokenizer", str(tokenizer_dir), "--corpus", str(bad_json),
        "--out", str(tmp_path / "x.ngram"), "--no-progress",
    )  # fmt: skip
    assert code == 2 and "line 2 is not valid JSON" in err and len(err.strip().splitlines()) == 1
    bad_text = tmp_path / "bad.txt"
    bad_text.write_bytes(b"w1 w2\n\xff\xfe w3\n")
    code, _, err = run_cli("ngram", "train", "--tokenizer", str(tokenizer_dir), "--corpus", str(bad_text),
        "--out", str(tmp_path / "x.ngram"), "--no-progress",
    )  # fmt: skip
    assert code == 2 and "line 2 is not UTF-8" in err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    code, _, err = run_cli("ngram", "train", "--tokenizer", str(tokenizer_dir), "--corpus", str(empty),
        "--out", str(tmp_path / "x.ngram"), "--no-progress",
    )  # fmt: skip
    assert code == 2 and "no text" in err
    assert not (tmp_path / "x.ngram").exists()


def test_merge_refuses_other_tokenizers_and_orders(tmp_path, tokenizer_dir, bigram_model):
    from fixtures import build_tokenizer

    other = build_tokenizer()
    other.add_tokens(["extra"])
    other.save_pretrained(tmp_path / "other")
    corpus = write_corpora(tmp_path / "c")["txt"]
    train_cli(tmp_path / "other", tmp_path / "other.ngram", str(corpus), order=2)
    train_cli(tokenizer_dir, tmp_path / "trigram.ngram", str(corpus), order=3)
    for other_model, fragment in (("other.ngram", "different tokenizers"), ("trigram.ngram", "order")):
        code, _, err = run_cli("ngram", "merge", str(bigram_model), str(tmp_path / other_model),
            "--out", str(tmp_path / "m.ngram"),
        )  # fmt: skip
        assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.ngram").exists()
