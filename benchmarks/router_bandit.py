"""The sampled router with and without its policy bandit, against one fixed chain (docs/RESULTS.md).

    python benchmarks/router_bandit.py --language npi --limit 4
    python benchmarks/router_bandit.py --language npi --limit 4 --router adaptive

For each sampled story and continuation prompt it decodes, in one run and in turn: plain
decoding, a fixed chain (gamma 3: `ngram-distill`, or `ngram+context` for `--router adaptive`),
and the router with the bandit switched off (its per-step choices alone) and with it (the bandit
weighs the router's choices against fixed trees of independent draws by their measured rates). Both routers keep their
estimates from one prompt to the next, as the benchmark's do. It prints each prompt's speedups,
the means, where each router's steps went, and the bandit's rates and tries per policy.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections import defaultdict

from polyspec.bench.grid import ROUTERS, BenchConfig
from polyspec.bench.runner import TREE_BUDGET, TREE_DEPTH, plan_units, prepared_runner
from polyspec.drafters.adaptive import AdaptiveDrafter
from polyspec.specs import verify_costs

# Each router against the fixed chain of its best single drafter.
CHAINS = {"adaptive-distill": "ngram-distill", "adaptive": "ngram+context"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--language", default="npi")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--router", choices=sorted(CHAINS), default="adaptive-distill")
    args = parser.parse_args()
    router_name, chain = args.router, CHAINS[args.router]
    config = BenchConfig(
        languages=(args.language,),
        tasks=("story", "continuation"),
        modes=("sample",),
        limit=args.limit,
        drafters=(chain,),
    )
    runner, languages = prepared_runner(config)
    language = languages[0]
    routers = {}
    for name in ("router", "router + bandit"):
        parts = {part: runner.build_drafter(part, language) for part in ROUTERS[router_name]}
        routers[name] = AdaptiveDrafter(parts, verify_costs(runner.verifier))
    routers["router"].policies = None
    print(f"load average {os.getloadavg()[0]:.2f}")
    gains: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, list[float]] = defaultdict(list)
    gamma = config.gammas[0]
    for unit, language in plan_units(config, languages):
        ids = runner.decoder.encode(unit.prompt.text)
        plain = runner.generate(ids, None, 1, unit.mode, unit.seed)
        row = [unit.prompt.item]
        for name in (chain, *routers):
            if name == chain:
                spec = runner.generate(ids, runner.drafter(chain, language), gamma, unit.mode, unit.seed)
            else:
                spec = runner.generate(ids, routers[name], TREE_DEPTH, unit.mode, unit.seed, TREE_BUDGET)
            gains[name].append(plain.stats.seconds / spec.stats.seconds)
            calls[name].append(spec.stats.new_tokens / spec.stats.verifier_calls)
            row.append(f"{name} {gains[name][-1]:.2f}x")
        print(" | ".join(row), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name in gains:
        print(f"{name}: mean f {statistics.mean(gains[name]):.3f}, tokens per call {statistics.mean(calls[name]):.2f}")
    for name, router in routers.items():
        top = ", ".join(f"{route or 'plain'} {count}" for route, count in router.route.most_common(5))
        print(f"{name} steps: {top}")
    bandit = routers["router + bandit"].policies
    print("bandit: " + ", ".join(f"{n} {bandit.rate(n):.1f} tok/s over {bandit.tries[n]}" for n in bandit.names))


if __name__ == "__main__":
    main()
