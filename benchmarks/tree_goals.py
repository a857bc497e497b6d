"""The token-tree goals of `adaptive`, read from benchmark records (docs/RESULTS.md).

    python benchmarks/tree_goals.py docs/results/full-float32/results.jsonl

Prints the mean measured speedup f of sampled story + continuation (and per language), of
sampled translation, greedy `adaptive` against the best fixed chain drafter per task, the spread
of `none` (plain timed against itself), the cells where `adaptive` is below 0.98x plain, and per
drafter and mode the tokens per call, positions per call and verify seconds per call. A cell
(language, task, mode) holds every prompt's record: its f is their mean. `--router NAME` reads
another router's records (`adaptive-distill`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

CHAINS = ("ngram-bigram", "ngram", "ngram+context", "prompt-lookup", "ngram-distill", "ngram-distill+context")


def mean_f(cells: dict, keys: list, drafter: str) -> float | None:
    """The mean f of every record of `drafter` in the cells `keys`, each prompt counting once."""
    values = [r["f_measured"] for k in keys for r in cells[k].get(drafter, [])]
    return statistics.mean(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--router", default="adaptive")
    args = parser.parse_args()
    router = args.router
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    cells: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for r in records:
        cells[(r["language"], r["task"], r["mode"])][r["drafter"]].append(r)
    chains = [d for d in CHAINS if any(d in cell for cell in cells.values())]
    print(f"{len(records)} records, languages {', '.join(sorted({k[0] for k in cells}))}")

    stories = [k for k in cells if k[2] == "sample" and k[1] in ("story", "continuation")]
    per_language = {
        lang: round(mean_f(cells, [k for k in stories if k[0] == lang], router), 2)
        for lang in sorted({k[0] for k in stories})
    }
    overall = mean_f(cells, stories, router)
    print(f"sampled story + continuation: {router} {overall:.2f}x, per language {per_language}")
    print("  fixed chains: " + ", ".join(f"{d} {mean_f(cells, stories, d):.2f}x" for d in chains))
    translation = [k for k in cells if k[2] == "sample" and k[1] == "translation"]
    if translation:
        chains_text = ", ".join(f"{d} {mean_f(cells, translation, d):.2f}x" for d in chains)
        print(f"sampled translation: {router} {mean_f(cells, translation, router):.2f}x ({chains_text})")
    for task in ("translation", "story", "continuation"):
        greedy = [k for k in cells if k[2] == "greedy" and k[1] == task]
        if greedy:
            best = max(chains, key=lambda d: mean_f(cells, greedy, d))
            ours, theirs = mean_f(cells, greedy, router), mean_f(cells, greedy, best)
            print(f"greedy {task}: {router} {ours:.2f}x, best chain {best} {theirs:.2f}x, ratio {ours / theirs:.2f}")
    noise = [mean_f(cells, [k], "none") for k in cells if "none" in cells[k]]
    if noise:
        print(f"none (plain against itself): {min(noise):.2f}x to {max(noise):.2f}x per cell")
    routed = [k for k in cells if router in cells[k]]
    low = [k for k in routed if mean_f(cells, [k], router) < 0.98]
    print(f"cells at >= 0.98x plain: {len(routed) - len(low)} of {len(routed)}")
    for k in low:
        none = mean_f(cells, [k], "none")
        print(f"  {' '.join(k)}: {mean_f(cells, [k], router):.2f}x (none: {none if none is None else round(none, 2)}x)")
    for mode in ("greedy", "sample"):
        for drafter in (*chains, router):
            rs = [r for r in records if r["mode"] == mode and r["drafter"] == drafter]
            if rs:
                tau = statistics.mean(r["tau"] for r in rs)
                width = statistics.mean(r["nodes_per_call"] for r in rs)
                verify = statistics.mean(r["verify_seconds"] / r["verifier_calls"] for r in rs)
                print(f"{mode} {drafter}: tau {tau:.2f}, {width:.2f} positions and {verify * 1000:.0f} ms per call")


if __name__ == "__main__":
    main()
