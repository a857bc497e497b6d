"""Engine overhead and prompt-lookup speedup on the real verifier, against transformers.

For each prompt, four runs are interleaved in one process: polyspec plain, polyspec prompt
lookup, transformers plain `generate`, transformers `generate(prompt_lookup_num_tokens=gamma)`.
Reports tokens/s, the two speedup ratios, greedy identity, and the engine overhead per verifier
call (wall time outside model forwards and drafting) as a share of one forward step.

    .venv/bin/python benchmarks/bench_engine.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from polyspec.decoding import Decoder
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
from polyspec.specs import load_model

PROMPTS = [
    "Article 1. All human beings are born free and equal in dignity and rights. They are endowed with "
    "reason and conscience and should act towards one another in a spirit of brotherhood.\n"
    "Article 2. Everyone is entitled to all the rights and freedoms set forth in this Declaration.\n"
    "Repeat the two articles above exactly.\nArticle 1.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Monday: wake up, run 5 km, shower, work.\nTuesday: wake up, run 5 km, shower, work.\n"
    "Wednesday: wake up, run 5 km, shower, work.\nThursday:",
    "The list of colours: red, green, blue, red, green, blue, red, green, blue, red,",
]


class ForwardTimer:
    """Wraps CachedLM.forward to add up the time spent inside model forwards."""

    def __init__(self, lm) -> None:
        self.inner, self.seconds, self.calls = lm.forward, 0.0, 0
        lm.forward = self

    def __call__(self, tokens, num_logits=None):
        start = time.perf_counter()
        out = self.inner(tokens, num_logits)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


def hf_generate(model, ids, max_new_tokens, gamma=None):
    kwargs = {"prompt_lookup_num_tokens": gamma} if gamma else {}
    start = time.perf_counter()
    out = model.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        **kwargs,
    )
    return out[0, len(ids) :].tolist(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier", default="gemma3-270m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the summary as JSON here")
    args = parser.parse_args()

    verifier = load_model(args.verifier, dtype=args.dtype)
    decoder = Decoder(verifier)
    timer = ForwardTimer(decoder.lm)
    model = verifier.model
    rows = []
    warm = decoder.encode(PROMPTS[0])
    decoder.generate(warm, None, max_new_tokens=8)
    hf_generate(model, warm, 8, args.gamma)
    for repeat in range(args.repeats):
        for index, prompt in enumerate(PROMPTS):
            ids = decoder.encode(prompt)
            row = {"prompt": index, "repeat": repeat, "load": os.getloadavg()[0]}
            for name, drafter in [("plain", None), ("lookup", PromptLookupDrafter(1, 3))]:
                timer.seconds, timer.calls = 0.0, 0
                # Never stop early: EOS would give the runs different lengths.
                result = decoder.generate(
                    ids,
                    drafter,
                    gamma=args.gamma,
                    max_new_tokens=args.max_new_tokens,
                    eos_token_ids=frozenset(),
                )
                s = result.stats
                prefill = 1 if len(ids) > 1 else 0
                step_forwards = timer.calls - prefill
                overhead = s.seconds - s.draft_seconds - timer.seconds
                row[name] = {
                    "tokens": result.token_ids,
                    "seconds": s.seconds,
                    "tokens_per_second": s.tokens_per_second,
                    "acceptance_rate": s.acceptance_rate,
                    "tokens_per_call": s.tokens_per_call,
                    "overhead_per_call": overhead / s.verifier_calls,
                    "forward_per_call": (timer.seconds / timer.calls) if step_forwards else 0.0,
                }
            row["hf_plain_tokens"], row["hf_plain_seconds"] = hf_generate(model, ids, args.max_new_tokens)
            row["hf_lookup_tokens"], row["hf_lookup_seconds"] = hf_generate(model, ids, args.max_new_tokens, args.gamma)
            rows.append(row)
            print(
                f"prompt {index} rep {repeat}: plain {row['plain']['tokens_per_second']:.1f} tok/s, "
                f"lookup {row['lookup']['tokens_per_second']:.1f} tok/s "
                f"(alpha {row['lookup']['acceptance_rate']:.2f}), "
                f"hf plain {args.max_new_tokens / row['hf_plain_seconds']:.1f}, "
                f"hf lookup {args.max_new_tokens / row['hf_lookup_seconds']:.1f}, load {row['load']:.2f}",
                flush=True,
            )

    def mean(values):
        return statistics.fmean(values)

    plain_step = mean([r["plain"]["forward_per_call"] for r in rows])
    summary = {
        "verifier": args.verifier,
        "dtype": args.dtype,
        "gamma": args.gamma,
        "max_new_tokens": args.max_new_tokens,
        "runs": len(rows),
        "plain_tokens_per_second": mean([r["plain"]["tokens_per_second"] for r in rows]),
        "polyspec_lookup_speedup": mean([r["plain"]["seconds"] / r["lookup"]["seconds"] for r in rows]),
        "hf_lookup_speedup": mean([r["hf_plain_seconds"] / r["hf_lookup_seconds"] for r in rows]),
        "polyspec_plain_vs_hf_plain": mean([r["hf_plain_seconds"] / r["plain"]["seconds"] for r in rows]),
        "lookup_acceptance_rate": mean([r["lookup"]["acceptance_rate"] for r in rows]),
        "forward_step_seconds": plain_step,
        "overhead_per_call_plain": mean([r["plain"]["overhead_per_call"] for r in rows]),
        "overhead_per_call_lookup": mean([r["lookup"]["overhead_per_call"] for r in rows]),
        "identical_lookup_vs_plain": sum(r["lookup"]["tokens"] == r["plain"]["tokens"] for r in rows),
        "identical_plain_vs_hf": sum(r["plain"]["tokens"] == r["hf_plain_tokens"] for r in rows),
        "identical_hf_lookup_vs_hf_plain": sum(r["hf_lookup_tokens"] == r["hf_plain_tokens"] for r in rows),
        "max_load": max(r["load"] for r in rows),
    }
    summary["overhead_share_of_step"] = summary["overhead_per_call_lookup"] / plain_step
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(summary, handle, indent=2)


if __name__ == "__main__":
    main()
