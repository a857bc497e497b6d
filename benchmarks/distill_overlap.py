"""How close distilled n-grams come to the verifier, without a clock: tokens against corpus weight.

The verifier samples the benchmark's own story and continuation prompts (held out from every
distillation) with the study's settings, keeping its whole distribution p at each position (top-k
leaves at most 50 tokens), and writes greedy paths for all three tasks. For each n-gram, built
from the first N tokens of the benchmark's cached samples (--tokens) mixed with the corpus split
at weight W (--weights, as `DISTILL_CORPUS_WEIGHT`), and for the corpus n-gram:

- sampled: the mean over positions of sum_x min(p(x), q(x)), q the row the n-gram draws a
  drafted token from there: the chance that a sampled draft's first token is accepted;
- greedy: the share of positions where the n-gram's most probable token is the verifier's.

Of the benchmark's n-gram order. Sampling what the cache lacks takes minutes (docs/NGRAM.md); the
scoring takes seconds. Writes OUT/overlap.json and OUT/overlap.png (sampled acceptance against
sampling time) and prints a table.

    .venv/bin/python benchmarks/distill_overlap.py --languages npi,yor --tokens 24000,48000,72000 \
        --weights 0,1,4,16 --out runs/distill-overlap
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from polyspec.assets.languages import get_language
from polyspec.assets.store import home
from polyspec.bench.grid import BenchConfig
from polyspec.bench.runner import DistilledNGrams, NGramModels, corpus_documents
from polyspec.files import write_atomic
from polyspec.ngram import load
from polyspec.ngram_distill import SelfCorpusSettings, Shards, distill_ngram, eos_ids, generate_corpus, sample_batch
from polyspec.specs import load_model
from polyspec.tasks import build_prompts

HELD_OUT_TOKENS = 48


def held_out(verifier, language, prompts: int, path: Path) -> dict:
    """Sampled rows with the verifier's whole distribution, and greedy paths (cached in `path`)."""
    if path.exists():
        return json.loads(path.read_text())
    settings = SelfCorpusSettings(keep_top=64, sample_tokens=HELD_OUT_TOKENS)
    eos = eos_ids(verifier)
    sampled = []
    for task in ("story", "continuation"):
        ids = [verifier.tokenizer(p.text)["input_ids"] for p in build_prompts(language, task, limit=prompts)]
        for out, prompt in zip(sample_batch(verifier, ids, settings, 12345, eos), ids, strict=True):
            sampled.append({"prompt": prompt, "ids": out.ids, "top_ids": out.top_ids, "top_probs": out.top_probs})
    greedy = []
    for task in ("translation", "story", "continuation"):
        for p in build_prompts(language, task, limit=prompts):
            ids = verifier.tokenizer(p.text, return_tensors="pt")["input_ids"].to(verifier.device)
            with torch.inference_mode():
                out = verifier.model.generate(ids, max_new_tokens=HELD_OUT_TOKENS, do_sample=False)
            greedy.append({"task": task, "prompt": ids[0].tolist(), "ids": out[0, ids.shape[1] :].tolist()})
    result = {"sampled": sampled, "greedy": greedy}
    write_atomic(path, json.dumps(result))
    return result


def score(model, held: dict) -> dict:
    vocab = model.vocab_size
    overlap, positions = 0.0, 0
    for row in held["sampled"]:
        context = list(row["prompt"])
        for token, ids, probs in zip(row["ids"], row["top_ids"], row["top_probs"], strict=True):
            found = model.context_node(context)
            if found is not None:
                q_ids, counts = model.continuations(*found)
                keep = q_ids < vocab
                q = counts[keep].astype(np.float64)
                p = dict(zip(ids, probs, strict=True))
                overlap += float(np.minimum([p.get(int(t), 0.0) for t in q_ids[keep]], q / q.sum()).sum())
            positions += 1
            context.append(token)
    agree: dict[str, list[int]] = {}
    for row in held["greedy"]:
        context = list(row["prompt"])
        for token in row["ids"]:
            found = model.context_node(context)
            counts = agree.setdefault(row["task"], [0, 0])
            counts[0] += found is not None and model.best(*found)[0] == token
            counts[1] += 1
            context.append(token)
    return {"sampled": round(overlap / positions, 4), **{f"greedy {t}": round(a / n, 4) for t, (a, n) in agree.items()}}


def prefix_samples(source: Path, tokens: int, out: Path) -> tuple[int, float]:
    """The first samples of `source` holding `tokens` tokens, copied to `out`; (tokens, minutes)."""
    kept, total, seconds = [], 0, 0.0
    for sample in Shards(source).read():
        if total >= tokens:
            break
        kept.append(sample)
        total += len(sample["ids"])
        seconds += sample["seconds"]
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "samples.jsonl", "".join(json.dumps(s) + "\n" for s in kept))
    return total, seconds / 60


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    languages = list(dict.fromkeys(r["language"] for r in rows))
    fig, axes = plt.subplots(1, len(languages), figsize=(5 * len(languages), 4), squeeze=False)
    for ax, code in zip(axes[0], languages, strict=True):
        mine = [r for r in rows if r["language"] == code]
        for model in dict.fromkeys(r["model"] for r in mine if "tokens" in r):
            line = [r for r in mine if r["model"] == model]
            ax.plot([r["sampling_minutes"] for r in line], [r["sampled"] for r in line], marker="o", label=model)
        corpus = next(r["sampled"] for r in mine if "tokens" not in r)
        ax.axhline(corpus, color="gray", linestyle="--", label="corpus n-gram")
        ax.axhline(3 * corpus, color="gray", linestyle=":", label="3x the corpus n-gram")
        ax.set(title=code, xlabel="verifier sampling time (min)", ylabel="sampled acceptance, first token")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--languages", default="npi,yor")
    parser.add_argument("--tokens", default="24000,48000,72000")
    parser.add_argument("--weights", default="0,1,4,16")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts per task")
    parser.add_argument("--out", type=Path, default=Path("runs/distill-overlap"))
    args = parser.parse_args()
    points = sorted(map(int, args.tokens.split(",")))
    weights = [int(w) for w in args.weights.split(",")]
    config = BenchConfig(languages=tuple(args.languages.split(",")))
    verifier = load_model(config.verifier, dtype=config.dtype, device=config.device)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for code in config.languages:
        language = get_language(code)
        held = held_out(verifier, language, args.prompts, args.out / f"held-out-{code}.json")
        corpus = load(NGramModels(verifier, home() / "ngram").path(language, config.ngram_order))
        rows.append({"language": code, "model": "corpus n-gram", **score(corpus, held)})
        cache = DistilledNGrams(verifier, home() / "ngram", points[-1])
        for _ in generate_corpus(verifier, language, cache.samples_dir(language), cache.settings):
            pass
        for tokens in points:
            work = args.out / f"{code}-{tokens}.samples"
            sampled, minutes = prefix_samples(cache.samples_dir(language), tokens, work)
            for weight in weights:
                path = args.out / f"{code}-{tokens}-w{weight}.ngram"
                if not path.exists():
                    distill_ngram(
                        verifier, language, config.ngram_order, path, SelfCorpusSettings(tokens=sampled),
                        mix=corpus_documents(language), corpus_weight=weight, samples_dir=work,
                    )  # fmt: skip
                row = {"language": code, "model": f"distilled, weight {weight}", "tokens": sampled}
                rows.append({**row, "sampling_minutes": round(minutes, 2), **score(load(path), held)})
    write_atomic(args.out / "overlap.json", json.dumps({"dtype": str(verifier.dtype_name), "rows": rows}, indent=1))
    plot(rows, args.out / "overlap.png")
    columns = [k for k in rows[0] if k.startswith(("sampled", "greedy"))]
    print("| language | model | tokens | sampling min | " + " | ".join(columns) + " |")
    print("|---" * (4 + len(columns)) + "|")
    for r in rows:
        cells = [r["language"], r["model"], str(r.get("tokens", "")), str(r.get("sampling_minutes", ""))]
        print("| " + " | ".join(cells + [f"{r[c]:.3f}" for c in columns]) + " |")


if __name__ == "__main__":
    main()
