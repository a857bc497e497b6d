"""Where a router's sampled steps go, measured inside the decoder (docs/RESULTS.md).

    python benchmarks/router_steps.py --language npi --limit 3

For each sampled story and continuation prompt it decodes with plain decoding, the fixed chain
`ngram-distill` and the router `adaptive-distill`, and prints per prompt the measured speedups.
Then it prints the verify time of each step by kind (chain or tree) and width, timed around the
decoder's verify call, so the cost of widening a step is what the decoder pays and not the
forward curve measured after random ids. Last, where the router sent its steps and what its arms
were kept at depth 1 (decayed hits / trials, all confidence buckets pooled).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from polyspec.bench.grid import BenchConfig
from polyspec.bench.runner import plan_units, prepared_runner
from polyspec.decoding import Decoder
from polyspec.types import Draft

CHAIN, ROUTER = "ngram-distill", "adaptive-distill"


def timing_verify(times: dict) -> None:
    """Wraps the decoder's verify call so each step's time is kept by (kind, width)."""
    verify = Decoder._verify

    def timed(self, draft, ids, processor, generator):
        began = time.perf_counter()
        out = verify(self, draft, ids, processor, generator)
        kind = "chain" if isinstance(draft, Draft) or draft.is_chain else "tree"
        times[(kind, len(draft) + 1)].append(time.perf_counter() - began)
        return out

    Decoder._verify = timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--language", default="npi")
    parser.add_argument("--limit", type=int, default=3)
    args = parser.parse_args()
    config = BenchConfig(
        languages=(args.language,),
        tasks=("story", "continuation"),
        modes=("sample",),
        limit=args.limit,
        drafters=(CHAIN, ROUTER),
    )
    runner, languages = prepared_runner(config)
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    timing_verify(times)
    gains: dict[str, list[float]] = defaultdict(list)
    for unit, language in plan_units(config, languages):
        ids = runner.decoder.encode(unit.prompt.text)
        plain = runner.generate(ids, None, 1, unit.mode, unit.seed)
        row = [unit.prompt.item]
        for name in (CHAIN, ROUTER):
            drafter = runner.drafter(name, language)
            tree, depth = runner.tree_shape(name, drafter, config.gammas[0])
            spec = runner.generate(ids, drafter, depth, unit.mode, unit.seed, tree)
            gains[name].append(plain.stats.seconds / spec.stats.seconds)
            row.append(
                f"{name} {gains[name][-1]:.2f}x, {spec.stats.new_tokens / spec.stats.verifier_calls:.2f} tok/call"
            )
        print(" | ".join(row), flush=True)
    print("mean f: " + ", ".join(f"{name} {statistics.mean(f):.2f}x" for name, f in gains.items()))
    print("verify ms per step by kind and width (median, steps):")
    for (kind, width), seconds in sorted(times.items()):
        print(f"  {kind} {width}: {statistics.median(seconds) * 1000:.1f} ({len(seconds)})")
    router = runner.drafter(ROUTER, languages[0])
    print("router steps: " + ", ".join(f"{part or 'plain'} {n}" for part, n in router.route.most_common()))
    for arm in router.arms:
        acceptance = arm.acceptance
        b = acceptance.BUCKETS  # the pooled bucket: every judged first position
        print(f"  {arm.name}: depth 1 kept {acceptance.hits[1][b]:.1f} of {acceptance.trials[1][b]:.1f}")


if __name__ == "__main__":
    main()
