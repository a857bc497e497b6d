"""How often a first draft token is kept, by how it is drafted, in exact closed form (docs/ENGINE.md).

    python benchmarks/draw_headroom.py --language npi --limit 3

Along plain sampled stories and continuations (the study's settings) it takes, at every
position, the verifier's sampling distribution p and the row q the drafter `ngram-distill`
would draw from, and averages:

- the verifier's own top-k mass (what any k point masses could be kept at, at best);
- k independent draws from q, tried in turn against the verifier's residual: one is kept with
  chance 1 - prod(1 - sum(min(r_i, q))), r_1 = p, r_{i+1} = norm(max(r_i - q, 0));
- the top k tokens of q as point masses: kept with chance sum p(x) over them.
"""

from __future__ import annotations

import argparse

import torch

from polyspec.bench.grid import BenchConfig
from polyspec.bench.runner import plan_units, prepared_runner
from polyspec.sampling import STUDY_SAMPLING, LogitsProcessor

DRAFTER = "ngram-distill"
WIDTHS = (1, 2, 3, 4, 8)


def drawn_kept(p: torch.Tensor, q: torch.Tensor, widths=WIDTHS) -> dict[int, float]:
    """Chance that one of k independent draws from q is kept, for each k in widths."""
    kept, missed, residual = {}, 1.0, p
    for k in range(1, max(widths) + 1):
        missed *= 1.0 - float(torch.minimum(residual, q).sum())
        if k in widths:
            kept[k] = 1.0 - missed
        rest = torch.clamp(residual - q, min=0.0)
        if float(rest.sum()) <= 0:  # q covers the residual: every later draw is kept
            kept.update({w: 1.0 - missed for w in widths if w > k})
            break
        residual = rest / rest.sum()
    return kept


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
        drafters=(DRAFTER,),
    )
    runner, languages = prepared_runner(config)
    processor = LogitsProcessor(STUDY_SAMPLING)
    totals = {kind: dict.fromkeys(WIDTHS, 0.0) for kind in ("verifier top-k", "k draws", "top-k of q")}
    positions = 0
    for unit, language in plan_units(config, languages):
        ids = runner.decoder.encode(unit.prompt.text)
        sequence = ids + runner.generate(ids, None, 1, unit.mode, unit.seed).token_ids
        lm = runner.decoder.lm
        lm.reset()
        with torch.inference_mode():
            logits = lm.forward(sequence[:-1])  # row j predicts sequence[j + 1]
        drafter = runner.drafter(DRAFTER, language)
        drafter.start(ids, processor, torch.Generator().manual_seed(unit.seed))
        for end in range(len(ids), len(sequence)):
            context = sequence[:end]
            p = processor.probs(logits[end - 1 : end], context, end)[0]
            draft = drafter.propose(context, 1)
            positions += 1
            ranked = torch.sort(p, descending=True).values
            for k in WIDTHS:
                totals["verifier top-k"][k] += float(ranked[:k].sum())
            if draft.probs is None or not len(draft.tokens):
                continue  # nothing drafted: kept with chance 0
            q = draft.probs[0].float()
            for k, kept in drawn_kept(p, q).items():
                totals["k draws"][k] += kept
            top = torch.topk(q, max(WIDTHS)).indices
            for k in WIDTHS:
                totals["top-k of q"][k] += float(p[top[:k]].sum())
    print(f"{args.language}: {positions} positions, first draft token kept with chance")
    print("| kind | " + " | ".join(f"k = {k}" for k in WIDTHS) + " |")
    print("|---|" + "---|" * len(WIDTHS))
    for kind, by_width in totals.items():
        print(f"| {kind} | " + " | ".join(f"{by_width[k] / positions:.3f}" for k in WIDTHS) + " |")


if __name__ == "__main__":
    main()
