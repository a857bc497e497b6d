"""The token-tree goals of `adaptive`, read from benchmark records (docs/RESULTS.md).

    python benchmarks/tree_goals.py docs/results/full-float32/results.jsonl

Prints the mean measured speedup f of sampled story + continuation (and per language), of
sampled translation, greedy `adaptive` against the best fixed chain drafter per task, the spread
of `none` (plain timed against itself), the cells where `adaptive` is below 0.98x plain, and per
drafter and mode the tokens per call, positions per call and verify seconds per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

CHAINS = ("ngram-bigram", "ngram", "ngram+context", "prompt-lookup")


def mean_f(cells: dict, keys: list, drafter: str) -> float | None:
    values = [cells[k][drafter]["f_measured"] for k in keys if drafter in cells[k]]
    return statistics.mean(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path)
    records = [json.loads(line) for line in parser.parse_args().records.read_text().splitlines() if line.strip()]
    cells: dict[tuple, dict] = defaultdict(dict)
    for r in records:
        cells[(r["language"], r["task"], r["mode"])][r["drafter"]] = r
    chains = [d for d in CHAINS if any(d in cell for cell in cells.values())]
    print(f"{len(records)} records, languages {', '.join(sorted({k[0] for k in cells}))}")

    stories = [k for k in cells if k[2] == "sample" and k[1] in ("story", "continuation")]
    per_language = {
        lang: round(mean_f(cells, [k for k in stories if k[0] == lang], "adaptive"), 2)
        for lang in sorted({k[0] for k in stories})
    }
    overall = mean_f(cells, stories, "adaptive")
    print(f"sampled story + continuation: adaptive {overall:.2f}x, per language {per_language}")
    print("  fixed chains: " + ", ".join(f"{d} {mean_f(cells, stories, d):.2f}x" for d in chains))
    translation = [k for k in cells if k[2] == "sample" and k[1] == "translation"]
    if translation:
        chains_text = ", ".join(f"{d} {mean_f(cells, translation, d):.2f}x" for d in chains)
        print(f"sampled translation: adaptive {mean_f(cells, translation, 'adaptive'):.2f}x ({chains_text})")
    for task in ("translation", "story", "continuation"):
        greedy = [k for k in cells if k[2] == "greedy" and k[1] == task]
        if greedy:
            best = max(chains, key=lambda d: mean_f(cells, greedy, d))
            ours, theirs = mean_f(cells, greedy, "adaptive"), mean_f(cells, greedy, best)
            print(f"greedy {task}: adaptive {ours:.2f}x, best chain {best} {theirs:.2f}x, ratio {ours / theirs:.2f}")
    noise = [cell["none"]["f_measured"] for cell in cells.values() if "none" in cell]
    if noise:
        print(f"none (plain against itself): {min(noise):.2f}x to {max(noise):.2f}x per cell")
    routed = [k for k in cells if "adaptive" in cells[k]]
    low = [k for k in routed if cells[k]["adaptive"]["f_measured"] < 0.98]
    print(f"cells at >= 0.98x plain: {len(routed) - len(low)} of {len(routed)}")
    for k in low:
        none = cells[k].get("none", {}).get("f_measured")
        print(f"  {' '.join(k)}: {cells[k]['adaptive']['f_measured']:.2f}x (none: {none:.2f}x)")
    for mode in ("greedy", "sample"):
        for drafter in (*chains, "adaptive"):
            rs = [r for r in records if r["mode"] == mode and r["drafter"] == drafter]
            if rs:
                tau = statistics.mean(r["tau"] for r in rs)
                width = statistics.mean(r["nodes_per_call"] for r in rs)
                verify = statistics.mean(r["verify_seconds"] / r["verifier_calls"] for r in rs)
                print(f"{mode} {drafter}: tau {tau:.2f}, {width:.2f} positions and {verify * 1000:.0f} ms per call")


if __name__ == "__main__":
    main()
