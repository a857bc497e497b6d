"""Two benchmark runs of one grid, compared: record fields added and removed, and per drafter how
many greedy outputs are identical (by the output token hash where both runs record it, else by
the answer text, the new-token count and distinct-2 over every token).

    python benchmarks/bench_compare.py runs/quick-before/results.jsonl runs/quick-new/results.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

KEY = ("language", "task", "item", "mode", "drafter", "gamma", "seed")


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def same_output(a: dict, b: dict) -> bool:
    if a.get("output_sha256") and b.get("output_sha256"):
        return a["output_sha256"] == b["output_sha256"]
    return all(a.get(k) == b.get(k) for k in ("text", "new_tokens", "distinct2"))


def compare(before: list[dict], after: list[dict]) -> dict:
    fields_before = {k for r in before for k in r}
    fields_after = {k for r in after for k in r}
    old = {tuple(r[k] for k in KEY): r for r in before}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in after:
        match = old.get(tuple(r[k] for k in KEY))
        if r["mode"] != "greedy":
            continue
        if match is None:
            continue
        counts[r["drafter"]][0] += same_output(match, r)
        counts[r["drafter"]][1] += 1
    new_only = sorted({r["drafter"] for r in after} - {r["drafter"] for r in before})
    return {
        "records": [len(before), len(after)],
        "added": sorted(fields_after - fields_before),
        "removed": sorted(fields_before - fields_after),
        "identical_greedy": {d: f"{same}/{total}" for d, (same, total) in counts.items() if total},
        "drafters_new": new_only,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    print(json.dumps(compare(read(args.before), read(args.after)), indent=2))


if __name__ == "__main__":
    main()
