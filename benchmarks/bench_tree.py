"""Token-tree bookkeeping against the verify call it serves, on the embedded Gemma-3-270M.

Part 1 (tree overhead). After a prompt of `--prompt` tokens, for trees of 8, 16 and 32 nodes
(random shapes with one deep branch), time in turn, call by call:
- mask: building the 4D masks of one tree forward (ancestors, sliding windows);
- tree verify: the forward of the tree (mask building included);
- keep: keeping the deepest root-to-leaf path (gathering its cache entries into place);
- chain verify: a forward of as many tokens as a chain, cut back by a crop.
Overhead = (mask + keep) / tree verify.

Part 2 (verify cost by width). A forward of 1, 2, 4, 8, 16, 32 tokens after the prompt, cut
back after each; medians, widths taking turns.

    flock /tmp/polyspec-bench.lock .venv/bin/python benchmarks/bench_tree.py --out tree.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

from polyspec.cached_lm import CachedLM
from polyspec.models import synchronizer
from polyspec.specs import load_model


def tree_shape(rng: random.Random, size: int) -> list[int]:
    """Parents of a draft-like tree: a deep branch of half the nodes, the rest hanging anywhere."""
    chain = size // 2
    return [-1, *(i - 1 if i < chain else rng.randrange(i) for i in range(1, size))]


def deepest_path(parents: list[int]) -> list[int]:
    depth = []
    for parent in parents:
        depth.append(0 if parent == -1 else depth[parent] + 1)
    node = max(range(len(parents)), key=depth.__getitem__)
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]


def timed(sync, fn) -> float:
    sync()
    began = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - began


def tree_overhead(lm: CachedLM, prompt: list[int], sizes: list[int], repeats: int, vocab: int) -> dict:
    sync = synchronizer(lm.device)
    rng = random.Random(0)
    lm.reset()
    lm.forward(prompt[:-1], num_logits=1)
    base = lm.length
    times = {size: {"mask": [], "tree": [], "keep": [], "chain": []} for size in sizes}
    for round_ in range(repeats + 1):  # round 0 warms up
        for size in sizes:
            parents = tree_shape(rng, size)
            depths = [0] * size
            for i, parent in enumerate(parents):
                depths[i] = 0 if parent == -1 else depths[parent] + 1
            tokens = [prompt[-1], *(rng.randrange(vocab) for _ in range(size - 1))]
            path = deepest_path(parents)
            with torch.inference_mode():
                mask = timed(sync, lambda parents=parents, depths=depths: lm._tree_mask(parents, depths))
            tree = timed(sync, lambda tokens=tokens, parents=parents: lm.forward(tokens, parents=parents))
            keep = timed(sync, lambda path=path: lm.keep(path))
            lm.rollback(base)
            chain = timed(sync, lambda tokens=tokens: lm.forward(tokens))
            lm.rollback(base)
            if round_:
                for name, value in (("mask", mask), ("tree", tree), ("keep", keep), ("chain", chain)):
                    times[size][name].append(value)
    result = {}
    for size in sizes:
        median = {name: statistics.median(values) for name, values in times[size].items()}
        result[size] = {
            "mask_ms": 1e3 * median["mask"],
            "tree_verify_ms": 1e3 * median["tree"],
            "keep_ms": 1e3 * median["keep"],
            "chain_verify_ms": 1e3 * median["chain"],
            "overhead_share": (median["mask"] + median["keep"]) / median["tree"],
            "tree_over_chain": median["tree"] / median["chain"],
        }
    return result


def verify_by_width(lm: CachedLM, prompt: list[int], widths: list[int], repeats: int, vocab: int) -> dict:
    sync = synchronizer(lm.device)
    rng = random.Random(1)
    lm.reset()
    lm.forward(prompt, num_logits=1)
    base = lm.length
    times = {width: [] for width in widths}
    for round_ in range(repeats + 1):
        for width in widths:
            tokens = [rng.randrange(vocab) for _ in range(width)]
            seconds = timed(sync, lambda tokens=tokens: lm.forward(tokens))
            lm.rollback(base)
            if round_:
                times[width].append(seconds)
    one = statistics.median(times[widths[0]])
    return {
        width: {"ms": 1e3 * statistics.median(values), "relative": statistics.median(values) / one}
        for width, values in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier", default="gemma3-270m")
    parser.add_argument("--dtype", default="bfloat16", help="auto | float32 | bfloat16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt", type=int, default=200, help="prompt tokens before the verify calls")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32], help="tree sizes (nodes)")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.verifier, dtype=args.dtype, device=args.device)
    lm = CachedLM(loaded.model)
    vocab = loaded.vocab_size
    rng = random.Random(2)
    prompt = [rng.randrange(vocab) for _ in range(args.prompt)]
    result = {
        "settings": vars(args),
        "dtype": loaded.dtype_name,
        "attention": loaded.model.config._attn_implementation,
        "threads": torch.get_num_threads(),
        "load_before": os.getloadavg()[0],
    }
    result["tree"] = tree_overhead(lm, prompt, args.sizes, args.repeats, vocab)
    result["verify_by_width"] = verify_by_width(lm, prompt, args.widths, args.repeats, vocab)
    result["load_after"] = os.getloadavg()[0]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
