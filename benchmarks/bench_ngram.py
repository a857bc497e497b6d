"""Speed and size of the n-gram drafter: tokenising, counting, bytes per n-gram on disk, peak
memory while training, microseconds per drafted token, and the time from opening a model file
to its first draft, for this format and the one before (format version 1).

    python benchmarks/bench_ngram.py [--tokenizer gemma3-270m] [--corpus-mb 100] [--workdir DIR]

The corpus: the multilingual running text shipped in the `dataset-build` package (about 5 MB,
37 languages), once as is, then continued to --corpus-mb with sentences sampled from a
word-bigram chain fitted to that text (per language), so that n-gram statistics stay text-like
instead of repeating the same n-grams. Counting is timed on tokens already in memory, the same
chunked, streamed path `polyspec ngram train` takes; tokenising is timed separately. Peak memory
is the resident set of a `polyspec ngram train` subprocess over the whole corpus.

The format before (one JSON-headed container read whole, checksummed and indexed at load) is
taken from git at --baseline (its storage.py and query.py, run from their source): the same
counts are written in both formats, and opening each to its first draft, and drafting speed,
are measured interleaved in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections import defaultdict
from pathlib import Path

import numpy as np
from synthetic_text import corpus_documents, sampler, source_lines

from polyspec.drafters.ngram import NGramDrafter, NGramOptions
from polyspec.files import write_atomic
from polyspec.ngram import load as load_model
from polyspec.ngram.corpus import RecordFormat, read_documents
from polyspec.ngram.counting import CHUNK_TOKENS, ChunkMerger, count_chunk
from polyspec.ngram.query import NGramModel
from polyspec.ngram.storage import save, verify
from polyspec.ngram.tokenize import BatchEncoder, ChunkBuffer
from polyspec.sampling import LogitsProcessor, SamplingConfig
from polyspec.vocabulary import fingerprint as vocabulary_fingerprint

REPO = Path(__file__).resolve().parents[1]
BASELINE = "54cd92dbe1a664d8687db3e1429c6010f515db75"  # the last revision writing format version 1


def baseline_modules(revision: str) -> tuple[types.ModuleType, types.ModuleType]:
    """(storage, query) of polyspec.ngram at `revision`, executed from their source in git."""

    def module(name: str, path: str, replacements: dict[str, str]) -> types.ModuleType:
        command = ["git", "-C", str(REPO), "show", f"{revision}:{path}"]
        source = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        for old, new in replacements.items():
            source = source.replace(old, new)
        loaded = types.ModuleType(name)
        sys.modules[name] = loaded  # dataclasses look their module up
        exec(compile(source, f"{revision[:12]}:{path}", "exec"), loaded.__dict__)
        return loaded

    storage = module(
        "ngram_v1_storage",
        "src/polyspec/ngram/storage.py",
        {"from polyspec.ngram.tokenize import Fingerprint": "from polyspec.vocabulary import Fingerprint"},
    )
    query = module(
        "ngram_v1_query",
        "src/polyspec/ngram/query.py",
        {"from polyspec.ngram.storage import StoredModel": "from ngram_v1_storage import StoredModel"},
    )
    return storage, query


def build_corpus(path: Path, megabytes: float, seed: int = 0) -> int:
    """`synthetic_text.corpus_documents` in a file; returns its size in bytes."""
    text = "".join(line + "\n" for line in corpus_documents(megabytes, seed))
    path.write_text(text, encoding="utf-8")
    return len(text.encode())


def tokenize(corpus: Path, tokenizer) -> tuple[list[tuple[np.ndarray, np.ndarray]], float, int]:
    """Chunks as training makes them, the seconds spent in the tokenizer, and the token count."""
    encoder = BatchEncoder(tokenizer)
    buffer = ChunkBuffer(CHUNK_TOKENS)
    chunks, seconds, total = [], 0.0, 0
    for documents in read_documents(corpus, RecordFormat()):
        t0 = time.perf_counter()
        tokens, lengths = encoder.encode(documents)
        seconds += time.perf_counter() - t0
        total += len(tokens)
        buffer.add(tokens, lengths)
        if buffer.full:
            chunks.append(buffer.take())
    if len(buffer):
        chunks.append(buffer.take())
    return chunks, seconds, total


def count(chunks, order: int, vocab_size: int):
    t0 = time.perf_counter()
    merger = ChunkMerger(order, vocab_size)
    for tokens, lengths in chunks:
        merger.add(count_chunk(tokens, lengths, order, vocab_size))
    trie = merger.result()
    return trie, time.perf_counter() - t0


def peak_memory_mb(command: list[str]) -> tuple[float, str]:
    """Runs a command; returns its peak resident set (VmHWM, polled) and its stdout. The kernel's
    own maxrss of a child would include this process's memory, inherited across fork and exec."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    status, peak_kb = Path(f"/proc/{process.pid}/status"), 0
    while process.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak_kb = max(peak_kb, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.05)
    output = process.stdout.read()
    if process.wait() != 0:
        sys.exit(f"failed: {' '.join(command)}")
    return peak_kb / 1024, output


def peak_training_memory(tokenizer: str, corpus: Path, order: int, out: Path) -> dict:
    executable = Path(sys.executable).with_name("polyspec")
    command = [str(executable), "ngram", "train", "--tokenizer", tokenizer, "--corpus", str(corpus),
               "--order", str(order), "--out", str(out), "--no-progress", "--json"]  # fmt: skip
    peak, output = peak_memory_mb(command)
    report = json.loads(output)
    report["peak_rss_mb"] = peak
    return report


def tokenizer_memory(tokenizer: str) -> float:
    """Peak memory of loading the tokenizer alone: the floor under training's peak."""
    code = f"from polyspec.specs import load_tokenizer; load_tokenizer({tokenizer!r})"
    return peak_memory_mb([sys.executable, "-c", code])[0]


def drafting_speed(model: NGramModel, sequences: list[list[int]], vocab_size: int, options: NGramOptions,
                   greedy: bool, gamma: int, repeats: int) -> dict:  # fmt: skip
    """Microseconds per proposed token, wall-clock and CPU (the CPU figure is what a busy
    machine cannot inflate), proposing after every position of every sequence; best of
    `repeats`. The contexts are built before the clock starts."""
    import torch

    drafter = NGramDrafter(model, vocab_size, options)
    config = SamplingConfig() if greedy else SamplingConfig(temperature=1.0)
    contexts = [[sequence[:end] for end in range(1, len(sequence))] for sequence in sequences]
    best_wall = best_cpu = float("inf")
    first_wall = None
    for _ in range(repeats):
        proposed, wall, cpu = 0, 0.0, 0.0
        for sequence, prefixes in zip(sequences, contexts, strict=True):
            drafter.start(sequence[:1], LogitsProcessor(config), torch.Generator().manual_seed(0))
            propose = drafter.propose
            t0, c0 = time.perf_counter(), time.process_time()
            lengths = [len(propose(context, gamma)) for context in prefixes]
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0
            proposed += sum(lengths)
        best_wall = min(best_wall, wall / max(1, proposed))
        best_cpu = min(best_cpu, cpu / max(1, proposed))
        first_wall = first_wall or wall / max(1, proposed)
    positions = sum(map(len, contexts))
    return {"wall_us": best_wall * 1e6, "cpu_us": best_cpu * 1e6, "first_pass_wall_us": first_wall * 1e6,
            "mean_draft_length": proposed / positions}  # fmt: skip


def first_draft_seconds(open_model, context: list[int], gamma: int) -> float:
    """Seconds from opening a model file to the first proposal of a greedy drafter on it."""
    import torch

    t0 = time.perf_counter()
    model = open_model()
    drafter = NGramDrafter(model, model.vocab_size, NGramOptions())
    drafter.start(context[:1], LogitsProcessor(SamplingConfig()), torch.Generator().manual_seed(0))
    drafter.propose(context, gamma)
    return time.perf_counter() - t0


def opening(path: Path, old_path: Path, v1, context: list[int], gamma: int, repeats: int) -> dict:
    """Open-to-first-draft for both formats, interleaved; median of `repeats`. Also: copying
    every tensor out with safetensors' own numpy reader, which is what mapping avoids."""
    from safetensors import safe_open

    def copy_all() -> None:
        with safe_open(path, framework="numpy") as reader:
            for name in reader.keys():  # noqa: SIM118 (a reader, not a dict)
                reader.get_tensor(name)

    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        old = first_draft_seconds(lambda: v1[1].NGramModel(v1[0].load(old_path)), context, gamma)
        times["old_first_draft"].append(old)
        times["new_first_draft"].append(first_draft_seconds(lambda: load_model(path), context, gamma))
        t0 = time.perf_counter()
        copy_all()
        times["safe_open_copy"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    verify(path)
    row = {f"{label}_s": statistics.median(values) for label, values in times.items()}
    row["verify_s"] = time.perf_counter() - t0
    row["speedup"] = row["old_first_draft_s"] / row["new_first_draft_s"]
    return row


def dict_bigram_speed(sequences: list[list[int]], train_tokens: np.ndarray, gamma: int) -> float:
    """Reference: a plain Python dict from token to its most frequent successor."""
    pairs: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for a, b in zip(train_tokens[:2_000_000].tolist(), train_tokens[1:2_000_001].tolist(), strict=False):
        pairs[a][b] += 1
    best = {a: max(following, key=following.get) for a, following in pairs.items()}
    proposed, seconds = 0, 0.0
    for sequence in sequences:
        for end in range(1, len(sequence)):
            t0 = time.perf_counter()
            token, draft = sequence[end - 1], []
            for _ in range(gamma):
                token = best.get(token)
                if token is None:
                    break
                draft.append(token)
            seconds += time.perf_counter() - t0
            proposed += len(draft)
    return seconds / proposed * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default="gemma3-270m", help="tokenizer: a name polyspec.specs resolves, a path")
    parser.add_argument("--corpus-mb", type=float, default=100.0)
    parser.add_argument("--orders", default="1,2,3,4,5,8")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the format-version-1 code")
    parser.add_argument("--open-repeats", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=None, help="keep corpus and models here")
    parser.add_argument("--skip-training-memory", action="store_true")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    orders = [int(o) for o in args.orders.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-ngram-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"load_average": os.getloadavg(), "cpus": os.cpu_count()}

    from polyspec.specs import load_tokenizer

    v1 = baseline_modules(args.baseline)
    corpus = workdir / "corpus.txt"
    if not corpus.exists() or abs(corpus.stat().st_size - args.corpus_mb * 1e6) > 1e6:
        build_corpus(corpus, args.corpus_mb)
    results["corpus_bytes"] = corpus.stat().st_size
    tokenizer = load_tokenizer(args.tokenizer)
    fingerprint = vocabulary_fingerprint(tokenizer)
    chunks, tokenize_seconds, num_tokens = tokenize(corpus, tokenizer)
    results["tokens"] = num_tokens
    results["tokenize_tokens_per_s"] = num_tokens / tokenize_seconds
    print(f"corpus {results['corpus_bytes'] / 1e6:.1f} MB, {num_tokens:,} tokens, vocabulary {fingerprint.vocab_size}")
    print(f"tokenising: {results['tokenize_tokens_per_s'] / 1e6:.2f} M tokens/s ({tokenize_seconds:.1f} s)")

    # Text to draft on: half real sentences (seen in training), half fresh sentences sampled
    # with another seed (partly unseen, so back-off happens), tokenised.
    rng = random.Random(2)
    by_language = source_lines()
    real, sentence = [line for lines in by_language.values() for line in lines], sampler(by_language, rng)
    sample = rng.sample(real, 150) + [sentence() for _ in range(150)]
    sequences = [ids for ids in BatchEncoder(tokenizer)._id_lists(sample) if len(ids) > 2]

    results["orders"] = {}
    for order in orders:
        trie, seconds = count(chunks, order, fingerprint.vocab_size)
        path = workdir / f"order{order}.ngram"
        size = save(trie, fingerprint, path)
        old_path = workdir / f"order{order}.v1.ngram"
        v1[0].save(trie, fingerprint, old_path)
        row = {
            "count_seconds": seconds,
            "count_tokens_per_s": num_tokens / seconds,
            "ngrams": trie.ngram_counts(),
            "file_bytes": size,
            "old_file_bytes": old_path.stat().st_size,
            "bytes_per_ngram": size / sum(trie.ngram_counts()),
        }
        del trie
        row["opening"] = opening(path, old_path, v1, sequences[0], args.gamma, args.open_repeats)
        if order <= 4:
            models = {"new": load_model(path), "old": v1[1].NGramModel(v1[0].load(old_path))}
            for label, options, greedy in (
                ("greedy", NGramOptions(), True),
                ("greedy_context", NGramOptions(use_context=True), True),
                ("greedy_no_backoff", NGramOptions(backoff=False), True),
                ("sampling", NGramOptions(), False),
            ):
                seqs, repeats = (sequences, 3) if greedy else (sequences[:40], 1)
                for version in ("new", "old"):  # the new one first: its tables start empty
                    speed = drafting_speed(models[version], seqs, fingerprint.vocab_size, options, greedy,
                                           args.gamma, repeats)  # fmt: skip
                    row[f"drafting_{label}" if version == "new" else f"old_drafting_{label}"] = speed
            del models
        old_path.unlink()
        results["orders"][order] = row
        drafting = ", ".join(
            f"{k[9:]} {v['wall_us']:.2f} us ({v['cpu_us']:.2f} CPU; format 1: {row['old_' + k]['wall_us']:.2f} us)"
            for k, v in row.items()
            if k.startswith("drafting_")
        )
        opened = row["opening"]
        print(
            f"order {order}: counting {row['count_tokens_per_s'] / 1e6:.2f} M tokens/s ({seconds:.1f} s), "
            f"{sum(row['ngrams']):,} n-grams, {size / 1e6:.1f} MB ({row['bytes_per_ngram']:.2f} bytes/n-gram); "
            f"open to first draft {opened['new_first_draft_s'] * 1e3:.1f} ms, format 1 "
            f"{opened['old_first_draft_s'] * 1e3:.0f} ms ({opened['speedup']:.0f}x); safetensors copy "
            f"{opened['safe_open_copy_s'] * 1e3:.0f} ms; verify {opened['verify_s'] * 1e3:.0f} ms; drafting: {drafting}"
        )
    train_tokens = np.concatenate([tokens for tokens, _ in chunks])
    results["dict_bigram_us_per_token"] = dict_bigram_speed(sequences, train_tokens, args.gamma)
    print(f"reference dict bigram: {results['dict_bigram_us_per_token']:.2f} us/token")
    del chunks, train_tokens

    if not args.skip_training_memory:
        results["tokenizer_only_peak_rss_mb"] = tokenizer_memory(args.tokenizer)
        print(f"loading the tokenizer alone: peak RSS {results['tokenizer_only_peak_rss_mb']:.0f} MB")
        results["training"] = {}
        for order in (2, 4):
            report = peak_training_memory(args.tokenizer, corpus, order, workdir / f"train{order}.ngram")
            results["training"][order] = report
            print(
                f"polyspec ngram train --order {order}: peak RSS {report['peak_rss_mb']:.0f} MB, "
                f"{report['seconds']:.1f} s (tokenising {report['tokenize_seconds']:.1f} s, "
                f"counting {report['count_seconds']:.1f} s)"
            )
    results["load_average_after"] = os.getloadavg()
    print(f"load average before {results['load_average']}, after {results['load_average_after']}")
    if args.json_out:
        write_atomic(args.json_out, json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
