"""How many verifier tokens a distilled n-gram needs: acceptance against generation time.

For each language, the verifier samples one corpus of up to --max-tokens tokens (resumable; a
prefix of the log is exactly what a smaller run would have written), and an n-gram trained on
each prefix size is measured on the benchmark's own story and continuation prompts (held out:
no seed prompt uses them), sampled with the study's settings and greedy, against the order-4
corpus n-gram. Writes curve.json and curve.png under --out.

    .venv/bin/python benchmarks/ngram_distill_curve.py --languages npi,yor --out docs/results/ngram-distill
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from polyspec.assets.languages import get_language
from polyspec.decoding import Decoder
from polyspec.drafters.ngram import NGramDrafter, NGramOptions
from polyspec.ngram import load
from polyspec.ngram.train import train
from polyspec.ngram_distill import SelfCorpusSettings, Shards, generate_corpus
from polyspec.sampling import STUDY_SAMPLING, SamplingConfig
from polyspec.specs import load_model
from polyspec.tasks import build_prompts, corpus_text

MODES = {"sample": STUDY_SAMPLING, "greedy": SamplingConfig()}


def acceptance(decoder: Decoder, model_path: Path, prompts, mode: str, new_tokens: int, gamma: int) -> dict:
    """Mean acceptance rate and tokens per verifier call over the prompts (seed = prompt index)."""
    drafter = NGramDrafter(load(model_path), decoder.verifier.vocab_size, NGramOptions())
    rates, per_call = [], []
    for seed, prompt in enumerate(prompts):
        ids = decoder.encode(prompt.text)
        result = decoder.generate(
            ids,
            drafter,
            gamma=gamma,
            sampling=MODES[mode],
            max_new_tokens=new_tokens,
            seed=seed,
            eos_token_ids=frozenset(),
        )
        rates.append(result.stats.acceptance_rate)
        per_call.append(result.stats.tokens_per_call)
    return {"acceptance": statistics.mean(rates), "tokens_per_call": statistics.mean(per_call)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--languages", default="npi,yor")
    parser.add_argument("--verifier", default="gemma3-270m")
    parser.add_argument("--points", default="3000,6000,12000,24000,36000")
    parser.add_argument("--order", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4, help="per task (story, continuation)")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/ngram-distill-curve"))
    args = parser.parse_args()
    points = sorted(int(p) for p in args.points.split(","))
    verifier = load_model(args.verifier)
    decoder = Decoder(verifier)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for code in args.languages.split(","):
        language = get_language(code)
        work = args.out / code / "samples"
        settings = SelfCorpusSettings(tokens=points[-1])
        began = time.perf_counter()
        for total in generate_corpus(verifier, language, work, settings):
            print(f"{code}: {total} tokens sampled ({time.perf_counter() - began:.0f} s)", flush=True)
        samples = Shards(work).read()
        prompts = [p for task in ("story", "continuation") for p in build_prompts(language, task, limit=args.prompts)]
        corpus_model = args.out / code / "corpus-o4.ngram"
        train(verifier.tokenizer, corpus_text(language), order=4, out=corpus_model, show_progress=False)
        rows = {mode: acceptance(decoder, corpus_model, prompts, mode, args.new_tokens, args.gamma) for mode in MODES}
        results.append({"language": code, "tokens": 0, "minutes": 0.0, "source": "corpus order 4", **_flat(rows)})
        for point in points:
            prefix, count, seconds = [], 0, 0.0
            for sample in samples:
                if count >= point:
                    break
                prefix.append(verifier.tokenizer.decode(sample["ids"], skip_special_tokens=True))
                count += len(sample["ids"])
                seconds += sample.get("seconds", 0.0)
            path = args.out / code / f"distilled-{point}.ngram"
            train(verifier.tokenizer, prefix, order=args.order, out=path, show_progress=False)
            rows = {mode: acceptance(decoder, path, prompts, mode, args.new_tokens, args.gamma) for mode in MODES}
            row = {"language": code, "tokens": count, "minutes": seconds / 60, "source": "distilled", **_flat(rows)}
            results.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "curve.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "curve.png")


def _flat(rows: dict) -> dict:
    return {f"{mode}_{key}": value for mode, row in rows.items() for key, value in row.items()}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for axis, mode in zip(axes, MODES, strict=True):
        for code in sorted({r["language"] for r in results}):
            rows = [r for r in results if r["language"] == code and r["source"] == "distilled"]
            (line,) = axis.plot([r["minutes"] for r in rows], [r[f"{mode}_acceptance"] for r in rows], "o-", label=code)
            base = next(r for r in results if r["language"] == code and r["source"] != "distilled")
            axis.axhline(base[f"{mode}_acceptance"], color=line.get_color(), linestyle=":", linewidth=1)
        axis.set_title(f"{mode} (dotted: corpus n-gram, order 4)")
        axis.set_xlabel("verifier sampling time (min, this CPU)")
    axes[0].set_ylabel("acceptance rate")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
