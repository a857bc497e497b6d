"""One sampled draw from a [V] distribution, as `polyspec.sampling.sample` makes it (among the
tokens the row can give) against a multinomial over the whole vocabulary, on a top-k row of
Gemma 3's vocabulary; the two take turns, medians of `--repeats`.

    .venv/bin/python benchmarks/bench_sample.py [--vocab 262144] [--top-k 50] [--repeats 200]
"""

from __future__ import annotations

import statistics
import time

import torch
import typer

from polyspec.sampling import sample


def main(vocab: int = 262144, top_k: int = 50, repeats: int = 200, threads: int = 2) -> None:
    torch.set_num_threads(threads)
    probs = torch.zeros(vocab)
    probs[torch.randperm(vocab)[:top_k]] = torch.rand(top_k)
    probs /= probs.sum()
    generator = torch.Generator().manual_seed(0)
    ways = {
        "sample (support only)": lambda: sample(probs, generator),
        "multinomial over V": lambda: int(torch.multinomial(probs, 1, generator=generator).item()),
    }
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
