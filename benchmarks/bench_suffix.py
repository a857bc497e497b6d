"""The suffix index against the order-4 n-gram on the same corpora: build time and size per
million tokens, microseconds per drafted token, and acceptance on the benchmark's prompts.

    python benchmarks/bench_suffix.py --tokenizer gemma3-270m [--corpus-mb 30] [--workdir DIR]
        [--languages amh,haw,npi] [--limit 2] [--json-out results.json] [--skip-acceptance]

Speed: the running text shipped in the `dataset-build` package (37 languages), once as is,
then continued to --corpus-mb with sentences sampled from a per-language word-bigram chain
fitted to it. It is tokenised once (timed on its own); the suffix array and the n-gram counts
are then built from the same tokens in memory, each through the path `build` / `train` take,
and written to files. Drafting proposes gamma tokens after every position of 300 tokenised
sentences (half from the corpus, half freshly sampled), with a fresh drafter per pass.

Acceptance: for each language, both drafters are built from the benchmark's corpus split
(`polyspec.tasks.corpus_text`) and decode the benchmark's prompts (translation, continuation,
story) with the real verifier, greedy and with the study's sampling, `max_new_tokens` tokens
with no stop; every drafter decodes the same prompts with the same seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from synthetic_text import corpus_documents, sampler, source_lines

from polyspec.drafters.ngram import NGramDrafter, NGramOptions
from polyspec.files import write_atomic
from polyspec.ngram.counting import CHUNK_TOKENS, ChunkMerger, count_chunk
from polyspec.ngram.query import NGramModel
from polyspec.ngram.storage import load as load_ngram
from polyspec.ngram.storage import save as save_ngram
from polyspec.ngram.tokenize import BatchEncoder, ChunkBuffer
from polyspec.sampling import STUDY_SAMPLING, LogitsProcessor, SamplingConfig
from polyspec.suffix.array import suffix_array
from polyspec.suffix.build import token_text
from polyspec.suffix.drafter import SuffixDrafter, SuffixOptions
from polyspec.suffix.storage import load as load_suffix
from polyspec.suffix.storage import save as save_suffix
from polyspec.vocabulary import fingerprint

ORDER = 4


def build_speed(documents: list[str], tokenizer, workdir: Path) -> tuple[dict, Path, Path]:
    vocabulary = fingerprint(tokenizer)
    encoder = BatchEncoder(tokenizer)
    arrays, lengths, seconds = [], [], 0.0
    for i in range(0, len(documents), 4096):
        t0 = time.perf_counter()
        tokens, sizes = encoder.encode(documents[i : i + 4096])
        seconds += time.perf_counter() - t0
        arrays.append(tokens)
        lengths.append(sizes)
    tokens_total = int(sum(len(a) for a in arrays))
    result = {"documents": len(documents), "tokens": tokens_total, "tokenize_tokens_per_s": tokens_total / seconds}

    t0 = time.perf_counter()
    text = token_text(arrays, lengths)
    order = suffix_array(text)
    sort_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    suffix_path = workdir / "corpus.suffix"
    size = save_suffix(text, order, vocabulary, suffix_path, {})
    result["suffix"] = {
        "build_seconds": sort_seconds,
        "build_tokens_per_s": tokens_total / sort_seconds,
        "write_seconds": time.perf_counter() - t0,
        "file_bytes": size,
        "mb_per_million_tokens": size / tokens_total,
    }
    del text, order

    t0 = time.perf_counter()
    merger = ChunkMerger(ORDER, vocabulary.vocab_size)
    buffer = ChunkBuffer(CHUNK_TOKENS)  # whole documents, as training counts them
    for tokens, sizes in zip(arrays, lengths, strict=True):
        buffer.add(tokens, sizes)
        if buffer.full:
            merger.add(count_chunk(*buffer.take(), ORDER, vocabulary.vocab_size))
    if len(buffer):
        merger.add(count_chunk(*buffer.take(), ORDER, vocabulary.vocab_size))
    trie = merger.result()
    count_seconds = time.perf_counter() - t0
    ngram_path = workdir / f"corpus.o{ORDER}.ngram"
    t0 = time.perf_counter()
    size = save_ngram(trie, vocabulary, ngram_path)
    result["ngram"] = {
        "build_seconds": count_seconds,
        "build_tokens_per_s": tokens_total / count_seconds,
        "write_seconds": time.perf_counter() - t0,
        "file_bytes": size,
        "mb_per_million_tokens": size / tokens_total,
        "ngrams": sum(trie.ngram_counts()),
    }
    return result, suffix_path, ngram_path


def drafters(suffix_path: Path, ngram_path: Path, vocab_size: int, use_context: bool):
    """Fresh drafters (empty memos) of both kinds."""
    yield "suffix", SuffixDrafter(load_suffix(suffix_path), vocab_size, SuffixOptions(use_context=use_context))
    yield "ngram", NGramDrafter(NGramModel(load_ngram(ngram_path)), vocab_size, NGramOptions(use_context=use_context))


def drafting_speed(suffix_path, ngram_path, sequences, vocab_size: int, gamma: int, repeats: int = 3) -> dict:
    """Microseconds per proposed token (wall and CPU), best of `repeats` passes, the two
    drafters interleaved pass by pass; each pass starts from freshly loaded drafters."""
    results: dict = {}
    contexts = [[sequence[:end] for end in range(1, len(sequence))] for sequence in sequences]
    kinds = (("greedy", True, False), ("greedy_context", True, True), ("sampling", False, False))
    for label, greedy, use_context in kinds:
        config = SamplingConfig() if greedy else SamplingConfig(temperature=1.0)
        chosen = contexts if greedy else contexts[:40]
        for _ in range(repeats if greedy else 1):
            for name, drafter in drafters(suffix_path, ngram_path, vocab_size, use_context):
                proposed, wall, cpu = 0, 0.0, 0.0
                for prefixes in chosen:
                    drafter.start(prefixes[0], LogitsProcessor(config), torch.Generator().manual_seed(0))
                    t0, c0 = time.perf_counter(), time.process_time()
                    proposed += sum(len(drafter.propose(context, gamma)) for context in prefixes)
                    wall += time.perf_counter() - t0
                    cpu += time.process_time() - c0
                best = results.setdefault(label, {}).setdefault(name, {"wall_us": float("inf"), "cpu_us": float("inf")})
                best["wall_us"] = min(best["wall_us"], wall / max(1, proposed) * 1e6)
                best["cpu_us"] = min(best["cpu_us"], cpu / max(1, proposed) * 1e6)
                best["mean_draft_length"] = proposed / sum(map(len, chosen))
    return results


def acceptance(languages: list[str], limit: int, max_new_tokens: int, gamma: int, workdir: Path, dtype: str) -> dict:
    from polyspec.decoding import Decoder
    from polyspec.ngram.train import train
    from polyspec.specs import load_model
    from polyspec.suffix.build import build
    from polyspec.tasks import TASKS, build_prompts, corpus_text

    verifier = load_model("gemma3-270m", dtype=dtype)
    decoder = Decoder(verifier)
    modes = {"greedy": SamplingConfig(), "sample": STUDY_SAMPLING}
    table: dict = {}
    for code in languages:
        documents = [p.replace("\n", " ") for p in corpus_text(code)]
        suffix_path, ngram_path = workdir / f"{code}.suffix", workdir / f"{code}.o{ORDER}.ngram"
        build(verifier.tokenizer, documents, suffix_path)
        train(verifier.tokenizer, documents, order=ORDER, out=ngram_path, show_progress=False)
        vocab_size, ngram, index = verifier.vocab_size, NGramModel(load_ngram(ngram_path)), load_suffix(suffix_path)
        made = {
            "ngram": NGramDrafter(ngram, vocab_size, NGramOptions()),
            "ngram+context": NGramDrafter(ngram, vocab_size, NGramOptions(use_context=True)),
            "suffix": SuffixDrafter(index, vocab_size),
            "suffix+context": SuffixDrafter(index, vocab_size, SuffixOptions(use_context=True)),
        }
        sums: dict = defaultdict(lambda: defaultdict(float))
        tasks = [task for task in TASKS if task != "translation" or code != "eng"]
        prompts = [prompt for task in tasks for prompt in build_prompts(code, task, limit)]
        for prompt in prompts:
            ids = decoder.encode(prompt.text)
            for mode, sampling in modes.items():
                for name, drafter in made.items():
                    s = decoder.generate(ids, drafter, gamma=gamma, sampling=sampling, max_new_tokens=max_new_tokens,
                                         seed=0, eos_token_ids=frozenset()).stats  # fmt: skip
                    row = sums[(mode, name)]
                    for key in ("drafted", "accepted", "verifier_calls", "new_tokens", "draft_seconds", "proposed"):
                        row[key] += getattr(s, key)
        table[code] = {
            mode: {
                name: {
                    "alpha": row["accepted"] / max(1, row["drafted"]),
                    "tokens_per_call": row["new_tokens"] / max(1, row["verifier_calls"]),
                    "draft_us_per_proposed": row["draft_seconds"] / max(1, row["proposed"]) * 1e6,
                    "drafted": int(row["drafted"]),
                }
                for (m, name), row in sums.items()
                if m == mode
            }
            for mode in modes
        }
        table[code]["prompts"] = len(prompts)
        table[code]["corpus_tokens"] = load_suffix(suffix_path).num_tokens
        line = "  ".join(
            f"{mode} {name} {v['alpha']:.3f}/{v['tokens_per_call']:.2f}"
            for mode in modes
            for name, v in table[code][mode].items()
        )
        print(f"{code} ({len(prompts)} prompts, {table[code]['corpus_tokens']:,} corpus tokens): {line}", flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default="gemma3-270m", help="tokenizer for the speed part")
    parser.add_argument("--corpus-mb", type=float, default=30.0)
    parser.add_argument("--gamma", type=int, default=4, help="draft length for the speed part")
    parser.add_argument("--languages", default="amh,ber,grn,haw,ibo,npi", help="for the acceptance part")
    parser.add_argument("--limit", type=int, default=2, help="prompts per language and task")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--acceptance-gamma", type=int, default=3)
    parser.add_argument("--dtype", default="auto", help="the verifier's, for the acceptance part")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-acceptance", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-suffix-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"load_average": os.getloadavg(), "cpus": os.cpu_count()}
    torch.set_num_threads(args.threads)

    if not args.skip_speed:
        from polyspec.specs import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
        documents = corpus_documents(args.corpus_mb)
        speed, suffix_path, ngram_path = build_speed(documents, tokenizer, workdir)
        results["build"] = speed
        print(f"{speed['documents']:,} documents, {speed['tokens']:,} tokens; "
              f"tokenising {speed['tokenize_tokens_per_s'] / 1e6:.2f} M tokens/s")  # fmt: skip
        for name in ("suffix", "ngram"):
            row = speed[name]
            print(f"{name}: build {row['build_tokens_per_s'] / 1e6:.2f} M tokens/s ({row['build_seconds']:.1f} s), "
                  f"write {row['write_seconds']:.1f} s, {row['mb_per_million_tokens']:.2f} MB / M tokens")  # fmt: skip
        rng = random.Random(2)
        by_language = source_lines()
        real = [line for lines in by_language.values() for line in lines]
        fresh = sampler(by_language, random.Random(7))
        sample = rng.sample(real, 150) + [fresh() for _ in range(150)]
        sequences = [ids for ids in BatchEncoder(tokenizer)._id_lists(sample) if len(ids) > 2]
        vocab_size = fingerprint(tokenizer).vocab_size
        results["drafting"] = drafting_speed(suffix_path, ngram_path, sequences, vocab_size, args.gamma)
        for label, row in results["drafting"].items():
            print(f"drafting {label}: " + ", ".join(
                f"{name} {v['wall_us']:.2f} us ({v['cpu_us']:.2f} CPU), {v['mean_draft_length']:.2f} tokens/proposal"
                for name, v in row.items()
            ))  # fmt: skip
    if not args.skip_acceptance:
        languages = [code for code in args.languages.split(",") if code]
        results["acceptance"] = acceptance(
            languages, args.limit, args.max_new_tokens, args.acceptance_gamma, workdir, args.dtype
        )
    results["load_average_after"] = os.getloadavg()
    print(f"load average before {results['load_average']}, after {results['load_average_after']}")
    if args.json_out:
        write_atomic(args.json_out, json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
