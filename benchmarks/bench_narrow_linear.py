"""Verify-call cost by width with torch's linear kernel and with the narrow layout
(`polyspec.narrow_linear`), on one model, measured in turns in one run.

    python benchmarks/bench_narrow_linear.py [--model gemma3-270m] [--json out.json]

Prints, per width, the whole verify forward (after a 200-token context) and the output head's
product alone, in milliseconds, for both layouts, and each width's cost over one token's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from polyspec.drafters.adaptive import measure_verify_costs
from polyspec.files import write_atomic
from polyspec.narrow_linear import layout, narrow_forward
from polyspec.specs import load_model

WIDTHS = (1, 2, 4, 8, 16, 32)


def head_ms(weight: torch.Tensor, rows: int, narrow: bool, repeats: int = 5) -> float:
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    head.weight = torch.nn.Parameter(weight, requires_grad=False)
    x = torch.randn(1, rows, weight.shape[1])
    run = (lambda: narrow_forward(head, x)) if narrow else (lambda: F.linear(x, head.weight))
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            began = time.perf_counter()
            run()
            times.append(time.perf_counter() - began)
    return statistics.median(times[1:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--rounds", type=int, default=3, help="Turns of each layout.")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    os.environ["POLYSPEC_NARROW_LINEAR"] = "0"
    stock = load_model(args.model, dtype="float32").model
    os.environ["POLYSPEC_NARROW_LINEAR"] = "1"
    narrow = load_model(args.model, dtype="float32").model
    assert layout(stock) == "torch" and layout(narrow) == "narrow"
    load_before = os.getloadavg()[0]
    forward: dict[str, list[list[float]]] = {"torch": [], "narrow": []}
    for _ in range(args.rounds):  # in turns: a burst of other work slows both alike
        for name, model in (("torch", stock), ("narrow", narrow)):
            costs, _ = measure_verify_costs(model, widths=WIDTHS, repeats=3)
            forward[name].append([s * 1000 for s in costs.seconds])
    weight = narrow.get_output_embeddings().weight.detach()
    head = {name: [head_ms(weight, w, name == "narrow") for w in WIDTHS] for name in ("torch", "narrow")}
    result = {
        "model": args.model,
        "threads": torch.get_num_threads(),
        "load": [load_before, os.getloadavg()[0]],
        "widths": list(WIDTHS),
        "forward_ms": {k: [statistics.median(r[i] for r in v) for i in range(len(WIDTHS))] for k, v in forward.items()},
        "head_ms": head,
    }
    print(f"{args.model}, {result['threads']} threads, load {result['load'][0]:.2f} -> {result['load'][1]:.2f}")
    print("width  forward torch  narrow   (x one token)       head torch  narrow")
    for i, width in enumerate(WIDTHS):
        t, n = result["forward_ms"]["torch"][i], result["forward_ms"]["narrow"][i]
        t1, n1 = result["forward_ms"]["torch"][0], result["forward_ms"]["narrow"][0]
        print(
            f"{width:5d}  {t:12.1f} {n:7.1f}   ({t / t1:4.2f} / {n / n1:4.2f})"
            f"   {head['torch'][i]:12.1f} {head['narrow'][i]:7.1f}"
        )
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
