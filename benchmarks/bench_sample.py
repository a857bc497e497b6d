"""One sampled draw from a [V] distribution, as `polyspec.sampling.sample` makes it (among the
tokens the row can give) against a multinomial over the whole vocabulary, on a top-k row of
Gemma 3's vocabulary; then a step of `--rows` rows as distillation samples it
(`polyspec.ngram_distill.draw_with_candidates`: the draw and the 8 top candidates) against a
multinomial over the whole vocabulary and a top-8. Each pair takes turns, medians of `--repeats`.

    .venv/bin/python benchmarks/bench_sample.py [--vocab 262144] [--top-k 50] [--rows 10] [--repeats 200]
"""

from __future__ import annotations

import statistics
import time

import torch
import typer

from polyspec.ngram_distill import draw_with_candidates
from polyspec.sampling import sample


def main(vocab: int = 262144, top_k: int = 50, rows: int = 10, repeats: int = 200, threads: int = 2) -> None:
    torch.set_num_threads(threads)
    batch = torch.zeros(rows, vocab)
    for row in batch:
        row[torch.randperm(vocab)[:top_k]] = torch.rand(top_k)
    batch /= batch.sum(dim=-1, keepdim=True)
    probs = batch[0]
    generator = torch.Generator().manual_seed(0)
    timed({
        "sample (support only)": lambda: sample(probs, generator),
        "multinomial over V": lambda: int(torch.multinomial(probs, 1, generator=generator).item()),
    }, repeats)  # fmt: skip
    timed({
        f"{rows} rows, draw_with_candidates": lambda: [t.tolist() for t in draw_with_candidates(batch, 8, generator)],
        f"{rows} rows, multinomial over V and top-8": lambda: [
            torch.multinomial(batch, 1, generator=generator).tolist(), [t.tolist() for t in batch.topk(8, dim=-1)]
        ],
    }, repeats)  # fmt: skip


def timed(ways: dict, repeats: int) -> None:
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(repeats + 1):  # round 0 warms up
        for name, draw in ways.items():
            began = time.perf_counter()
            draw()
            if round_:
                times[name].append(time.perf_counter() - began)
    for name, seconds in times.items():
        print(f"{name}: {1000 * statistics.median(seconds):.3f} ms")


if __name__ == "__main__":
    typer.run(main)
