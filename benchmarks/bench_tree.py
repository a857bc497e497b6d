"""Token-tree bookkeeping against the verify call it serves, on the embedded Gemma-3-270M, and
adaptive trees against adaptive chains and plain decoding.

Part 1 (tree overhead in the cache). After a prompt of `--prompt` tokens, for trees of 8, 16 and
32 nodes (random shapes with one deep branch), time in turn, call by call:
- mask: building the 4D masks of one tree forward (ancestors, sliding windows);
- tree verify: the forward of the tree (mask building included);
- keep: keeping the deepest root-to-leaf path (gathering its cache entries into place);
- chain verify: a forward of as many tokens as a chain, cut back by a crop.
Overhead = (mask + keep) / tree verify.

Part 2 (the engine's tree bookkeeping). The same shapes as draft trees (`TokenTree`, the pending
token making the width), through the steps of `Decoder._verify`: the forward's parents and every
node's path (engine), the cache's checks, depths and position ids, the masks, the forward, the
judging of every row (greedy, and sampled with the study's sampling) with the tree verdict, and
`keep` of the deepest path. Bookkeeping = everything but the forward and the judging; its share
of the tree forward is the overhead. The judging is reported against a chain's of the same width.

Part 3 (verify cost by width). A forward of 1, 2, 4, 8, 16, 32 tokens after the prompt, cut
back after each; medians, widths taking turns. `--plot` draws it as a PNG.

Part 4 (`--decode`, adaptive trees). For each `--languages` code, `--stories` sampled story
prompts (`polyspec.tasks`, study sampling, exactly `--new-tokens` tokens: EOS and stop strings
off) decoded plain, with adaptive chains (gamma `--gamma`) and with adaptive trees (`--tree` nodes,
the same depth); the router is the benchmark's `adaptive`: n-gram, n-gram + context and prompt
lookup, the n-gram models trained from the language's corpus split, the width-cost curve measured in
this run. Modes take turns per prompt, with the same seeds.

    .venv/bin/python benchmarks/bench_tree.py --out tree.json
    .venv/bin/python benchmarks/bench_tree.py --decode --out adaptive.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

from polyspec.acceptance import greedy_tree_verdict, tree_rejection_verdict
from polyspec.cached_lm import CachedLM
from polyspec.models import synchronizer
from polyspec.sampling import STUDY_SAMPLING, LogitsProcessor, SamplingConfig
from polyspec.specs import load_model
from polyspec.tree import TokenTree


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


def engine_overhead(lm: CachedLM, prompt: list[int], sizes: list[int], repeats: int, vocab: int) -> dict:
    """Part 2: each step of one tree verify as the engine runs it, for draft trees whose forward
    width is `size`."""
    sync = synchronizer(lm.device)
    rng = random.Random(3)
    lm.reset()
    lm.forward(prompt[:-1], num_logits=1)
    base = lm.length
    ids = list(prompt)
    processors = {"greedy": LogitsProcessor(SamplingConfig()), "sampled": LogitsProcessor(STUDY_SAMPLING)}
    generator = torch.Generator().manual_seed(0)
    times: dict[int, dict[str, list[float]]] = {size: {} for size in sizes}

    def positions(parents: list[int]) -> None:  # CachedLM._feed_tree's depths and position ids
        depths: list[int] = []
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError("bad tree")
            depths.append(0 if parent == -1 else depths[parent] + 1)
        torch.tensor(depths, dtype=torch.long, device=lm.device) + lm.length

    def judge_tree(kind: str, draft: TokenTree, logits, suffixes) -> None:
        if kind == "greedy":
            greedy_tree_verdict(draft, processors[kind].greedy_after(logits, ids, suffixes))
        else:
            processor = processors[kind]  # rows processed along the walk only, as the decoder does
            tree_rejection_verdict(
                draft, lambda i: processor.probs_after(logits[i : i + 1], ids, suffixes[i : i + 1])[0], generator
            )

    def judge_chain(kind: str, tokens: list[int], logits) -> None:
        if kind == "greedy":
            processors[kind].greedy_tokens(logits, ids, len(ids), tokens)
        else:
            processors[kind].probs(logits, ids, len(ids), tokens)

    for round_ in range(repeats + 1):  # round 0 warms up
        for size in sizes:
            shape = tree_shape(rng, size)
            draft = TokenTree(
                tokens=[rng.randrange(vocab) for _ in range(size - 1)], parents=[p - 1 for p in shape[1:]]
            )
            tokens = [ids[-1], *draft.tokens]
            measured: dict[str, float] = {}
            sync()
            began = time.perf_counter()
            parents = draft.forward_parents()
            suffixes = [[], *(draft.path_tokens(node) for node in range(len(draft)))]
            measured["paths"] = time.perf_counter() - began
            depths = [0] * size
            for i, parent in enumerate(parents):
                depths[i] = 0 if parent == -1 else depths[parent] + 1
            with torch.inference_mode():
                measured["checks"] = timed(sync, lm.tree_support)
                measured["positions"] = timed(sync, lambda parents=parents: positions(parents))
                measured["mask"] = timed(sync, lambda parents=parents, depths=depths: lm._tree_mask(parents, depths))
                sync()
                began = time.perf_counter()
                logits = lm.forward(tokens, parents=parents)
                sync()
                measured["forward"] = time.perf_counter() - began
                for kind in processors:
                    measured[f"{kind}_judge"] = timed(
                        sync, lambda k=kind, d=draft, x=logits, s=suffixes: judge_tree(k, d, x, s)
                    )
                deepest = max(range(len(draft)), key=lambda n, d=draft: d.depths[n])
                path = [0, *(node + 1 for node in draft.path(deepest))]
                measured["keep"] = timed(sync, lambda path=path: lm.keep(path))
                lm.rollback(base)
                sync()
                began = time.perf_counter()
                logits = lm.forward(tokens)
                sync()
                measured["chain_forward"] = time.perf_counter() - began
                lm.rollback(base)
                for kind in processors:
                    measured[f"{kind}_chain_judge"] = timed(
                        sync, lambda k=kind, t=draft.tokens, x=logits: judge_chain(k, t, x)
                    )
            if round_:
                for name, value in measured.items():
                    times[size].setdefault(name, []).append(value)
    result = {}
    for size in sizes:
        median = {name: statistics.median(values) for name, values in times[size].items()}
        bookkeeping = median["paths"] + median["checks"] + median["positions"] + median["mask"] + median["keep"]
        entry = {f"{name}_ms": 1e3 * value for name, value in median.items()}
        entry["bookkeeping_ms"] = 1e3 * bookkeeping
        entry["bookkeeping_share"] = bookkeeping / median["forward"]
        entry["tree_over_chain_forward"] = median["forward"] / median["chain_forward"]
        result[size] = entry
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


def adaptive_router(loaded, language) -> dict:
    """The benchmark's `adaptive` arms for one language: n-gram, n-gram + context, prompt lookup."""
    from polyspec.assets.store import home
    from polyspec.bench.runner import NGramModels
    from polyspec.drafters.ngram import NGramDrafter, NGramOptions
    from polyspec.drafters.prompt_lookup import PromptLookupDrafter
    from polyspec.ngram import load

    model = load(NGramModels(loaded, home() / "ngram").path(language, 4))
    return {
        "ngram": NGramDrafter(model, loaded.vocab_size, NGramOptions()),
        "ngram+context": NGramDrafter(model, loaded.vocab_size, NGramOptions(use_context=True)),
        "prompt-lookup": PromptLookupDrafter(),
    }


def decode_comparison(loaded, languages: list[str], stories: int, new_tokens: int, gamma: int, tree: int) -> dict:
    """Part 4: plain, adaptive chains and adaptive trees on sampled story prompts."""
    from polyspec.assets.languages import get_language
    from polyspec.decoding import Decoder
    from polyspec.drafters.adaptive import AdaptiveDrafter, measure_verify_costs
    from polyspec.tasks import build_prompts

    decoder = Decoder(loaded)
    costs, _ = measure_verify_costs(loaded.model)  # in this run, not the cached curve: the same load as the runs
    result: dict = {"verify_costs": costs.to_dict(), "languages": {}}
    for code in languages:
        language = get_language(code)
        modes = {
            "plain": (None, 0),
            "adaptive-chains": (AdaptiveDrafter(adaptive_router(loaded, language), costs), 0),
            "adaptive-trees": (AdaptiveDrafter(adaptive_router(loaded, language), costs), tree),
        }
        warm = decoder.encode("Warm-up.")
        for drafter, budget in modes.values():
            decoder.generate(warm, drafter, gamma=gamma, tree=budget, sampling=STUDY_SAMPLING, max_new_tokens=4)
        totals = {
            name: {"tokens": 0, "seconds": 0.0, "draft_seconds": 0.0, "calls": 0, "accepted": 0, "nodes": 0}
            for name in modes
        }
        for index, prompt in enumerate(build_prompts(language, "story", limit=stories)):
            ids = decoder.encode(prompt.text)
            for name, (drafter, budget) in modes.items():
                stats = decoder.generate(
                    ids, drafter, gamma=gamma, tree=budget, sampling=STUDY_SAMPLING, max_new_tokens=new_tokens,
                    seed=index, eos_token_ids=frozenset(),
                ).stats  # fmt: skip
                entry = totals[name]
                entry["tokens"] += stats.new_tokens
                entry["seconds"] += stats.seconds
                entry["draft_seconds"] += stats.draft_seconds
                entry["calls"] += stats.verifier_calls
                entry["accepted"] += stats.accepted
                entry["nodes"] += stats.nodes_verified
        plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
        summary = {}
        for name, entry in totals.items():
            rate = entry["tokens"] / entry["seconds"]
            summary[name] = {
                **entry,
                "tokens_per_second": rate,
                "speedup": rate / plain,
                "tokens_per_call": entry["tokens"] / entry["calls"],
                "width_per_call": entry["nodes"] / entry["calls"],
                "draft_share": entry["draft_seconds"] / entry["seconds"],
            }
            drafter = modes[name][0]
            if drafter is not None:
                summary[name]["route"] = dict(drafter.route.most_common(8))
                if drafter.widths:
                    summary[name]["nodes_sent"] = dict(sorted(drafter.widths.items()))
        result["languages"][code] = summary
        print(code, json.dumps({name: round(v["speedup"], 3) for name, v in summary.items()}), flush=True)
    return result


def plot_widths(by_width: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted(by_width)
    relative = [by_width[w]["relative"] for w in widths]
    figure, axis = plt.subplots(figsize=(5, 3.2), dpi=120)
    axis.plot(widths, relative, marker="o", label="verify forward")
    axis.plot(widths, [1.0] * len(widths), linestyle=":", color="grey", label="one token")
    axis.set_xscale("log", base=2)
    axis.set_xticks(widths, [str(w) for w in widths])
    axis.set_xlabel("positions fed in one forward (width)")
    axis.set_ylabel("time / time of width 1")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)


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
    parser.add_argument("--skip-overhead", action="store_true", help="skip parts 1-3")
    parser.add_argument("--plot", default=None, help="draw the width-cost curve (part 3) as a PNG here")
    parser.add_argument("--decode", action="store_true", help="part 4: adaptive trees, chains and plain")
    parser.add_argument("--languages", nargs="+", default=["npi", "yor"])
    parser.add_argument("--stories", type=int, default=3, help="story prompts per language")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4, help="adaptive depth (chains and trees)")
    parser.add_argument("--tree", type=int, default=16, help="adaptive tree budget (nodes)")
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
    if not args.skip_overhead:
        result["tree"] = tree_overhead(lm, prompt, args.sizes, args.repeats, vocab)
        result["engine"] = engine_overhead(lm, prompt, args.sizes, args.repeats, vocab)
        result["verify_by_width"] = verify_by_width(lm, prompt, args.widths, args.repeats, vocab)
        if args.plot:
            title = f"{args.verifier} {loaded.dtype_name}, {torch.get_num_threads()} thread(s), {args.prompt} cached"
            plot_widths(result["verify_by_width"], args.plot, title)
    if args.decode:
        result["decode"] = decode_comparison(
            loaded, args.languages, args.stories, args.new_tokens, args.gamma, args.tree
        )
    result["load_after"] = os.getloadavg()[0]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
