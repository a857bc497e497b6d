"""The distilled n-gram tables of docs/RESULTS.md, read from benchmark records: per task and
mode, each drafter's mean measured f and pooled acceptance (accepted / drafted over the cell's
prompts); for sampled stories + continuations, the same per language with tokens kept and verify
milliseconds per call; the spread of `none` (plain decoding timed against itself) over the cells;
greedy acceptance per language and task.

    python benchmarks/distill_tables.py docs/results/distill-soft-limit8/results.jsonl
    python benchmarks/distill_tables.py docs/results/distill-soft/drawn-npi/results.jsonl \\
        docs/results/distill-soft/drawn-yor/results.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASKS = ("translation", "story", "continuation")
CELL = ("language", "task", "mode")


def mean_f(records: list[dict]) -> float:
    return sum(r["f_measured"] for r in records) / len(records)


def pooled(records: list[dict]) -> str:
    f = mean_f(records)
    acceptance = sum(r["accepted"] for r in records) / max(1, sum(r["drafted"] for r in records))
    return f"{f:.2f}x ({acceptance:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, nargs="+")
    paths = parser.parse_args().records
    records = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line]
    drafters = list(dict.fromkeys(r["drafter"] for r in records))
    languages = sorted({r["language"] for r in records})

    def pick(**fields) -> list[dict]:
        return [r for r in records if all(r[k] in v if isinstance(v, tuple) else r[k] == v for k, v in fields.items())]

    print(f"{len(records)} records; mean f (pooled acceptance)")
    print("| task, mode | " + " | ".join(drafters) + " |")
    for task in TASKS:
        for mode in ("greedy", "sample"):
            cells = [pooled(rs) if (rs := pick(task=task, mode=mode, drafter=d)) else "-" for d in drafters]
            if any(c != "-" for c in cells):
                print(f"| {task}, {mode} | " + " | ".join(cells) + " |")
    print("\nsampled story + continuation by language: mean f (pooled acceptance), tokens and ms per call")
    for language in [*languages, None]:
        cells = []
        for drafter in drafters:
            chosen = dict(mode="sample", task=("story", "continuation"), drafter=drafter)
            rs = pick(**chosen, language=language) if language else pick(**chosen)
            if not rs:
                continue
            calls = sum(r["verifier_calls"] for r in rs)
            tokens, ms = sum(r["new_tokens"] for r in rs) / calls, 1000 * sum(r["verify_seconds"] for r in rs) / calls
            cells.append(f"{drafter} {pooled(rs)}, {tokens:.2f} tok, {ms:.0f} ms")
        print(f"{language or 'all'}: " + "; ".join(cells))
    none = [r for r in records if r["drafter"] == "none"]
    by_cell: dict[tuple, list[dict]] = {}
    for r in none:
        by_cell.setdefault(tuple(r[k] for k in CELL), []).append(r)
    noise = [mean_f(rs) for rs in by_cell.values()]
    if noise:
        print(f"\nnone (plain against itself): {min(noise):.2f}x to {max(noise):.2f}x per cell")
    print("\ngreedy acceptance by language and task")
    for language in languages:
        for task in TASKS:
            picked = {d: pick(language=language, task=task, mode="greedy", drafter=d) for d in drafters}
            cells = [f"{d} {pooled(rs)}" for d, rs in picked.items() if rs]
            if cells:
                print(f"{language} {task}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
