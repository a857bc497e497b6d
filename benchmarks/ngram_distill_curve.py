"""How many verifier tokens a distilled n-gram needs: acceptance against generation time.

For each language, the verifier samples one corpus of up to --max-tokens tokens with the
settings `polyspec ngram distill` uses (resumable; a prefix of the log is exactly what a smaller
run would have written), and an n-gram trained on each prefix size (--points) is measured on the
benchmark's own story and continuation prompts (held out: no seed prompt uses them), sampled
with the study's settings and greedy, against the order-4 corpus n-gram of the language's
corpus split. Acceptance is pooled over the prompts (accepted / drafted); the x axis is the
verifier's sampling time as logged with the samples, on this machine.

The samples are drawn with --sample-dtype (default auto, what `polyspec ngram distill` uses:
bfloat16 where the CPU computes in it natively, else float32) and acceptance is measured with
the verifier in --dtype (default bfloat16, as the benchmark grid runs it). Each sample's log
line holds its share of its batch's wall-clock and CPU time; the curve's x axis is wall-clock.

Sampling stops at --max-tokens, or once a language has sampled for --max-minutes; the points
are those of --points below what was sampled, and all of it. --max-wall-minutes skips the
evaluations left once the whole run has taken that long, so a run's length is bounded. Samples
and models go to --workdir; curve.json (rewritten after every point) and curve.png to --out.

    .venv/bin/python benchmarks/ngram_distill_curve.py --languages npi,yor --max-minutes 9 \
        --workdir runs/ngram-distill-curve --out docs/results/ngram-distill
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from polyspec.assets.languages import get_language
from polyspec.decoding import Decoder
from polyspec.drafters.ngram import NGramDrafter, NGramOptions
from polyspec.files import write_atomic
from polyspec.models import resolve_dtype
from polyspec.ngram import load
from polyspec.ngram.train import train
from polyspec.ngram_distill import SAMPLE_UNIT, SelfCorpusSettings, Shards, eos_ids, generate_corpus, sample_counts
from polyspec.sampling import STUDY_SAMPLING, SamplingConfig
from polyspec.specs import load_model
from polyspec.tasks import build_prompts, corpus_text
from polyspec.vocabulary import fingerprint

MODES = {"sample": STUDY_SAMPLING, "greedy": SamplingConfig()}
TASKS = ("story", "continuation")


def acceptance(decoder: Decoder, model_path: Path, prompts, mode: str, new_tokens: int, gamma: int) -> dict:
    """Acceptance pooled over the prompts and per task, and tokens per verifier call (seed =
    prompt index, the same for every model)."""
    drafter = NGramDrafter(load(model_path), decoder.verifier.vocab_size, NGramOptions())
    sums: dict[str, list[int]] = {task: [0, 0, 0, 0] for task in TASKS}  # accepted, drafted, new, calls
    for seed, (task, prompt) in enumerate(prompts):
        stats = decoder.generate(
            decoder.encode(prompt.text),
            drafter,
            gamma=gamma,
            sampling=MODES[mode],
            max_new_tokens=new_tokens,
            seed=seed,
            eos_token_ids=frozenset(),
        ).stats
        row = sums[task]
        row[0] += stats.accepted
        row[1] += stats.drafted
        row[2] += stats.new_tokens
        row[3] += stats.verifier_calls
    total = [sum(row[i] for row in sums.values()) for i in range(4)]
    result = {"acceptance": total[0] / max(1, total[1]), "tokens_per_call": total[2] / max(1, total[3])}
    result.update({f"{task}_acceptance": row[0] / max(1, row[1]) for task, row in sums.items()})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--languages", default="npi,yor")
    parser.add_argument("--verifier", default="gemma3-270m")
    parser.add_argument("--dtype", default="bfloat16", help="of the verifier that judges the drafts")
    parser.add_argument("--sample-dtype", default="auto", help="of the verifier that samples the corpus")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    parser.add_argument("--max-wall-minutes", type=float, default=34.0)
    parser.add_argument("--max-tokens", type=int, default=30_000, help="verifier tokens sampled per language")
    parser.add_argument("--max-minutes", type=float, default=None, help="sampling time per language, at most")
    parser.add_argument("--points", default="1500,3000,6000,12000,24000")
    parser.add_argument("--order", type=int, default=3)
    parser.add_argument("--mix-corpus", action="store_true", help="mix the corpus split into each distilled n-gram")
    parser.add_argument("--prompts", type=int, default=3, help="per task (story, continuation)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("runs/ngram-distill-curve"))
    parser.add_argument("--out", type=Path, default=Path("runs/ngram-distill-curve"))
    args = parser.parse_args()
    points = sorted(p for p in (int(p) for p in args.points.split(",")) if p <= args.max_tokens)
    began = time.perf_counter()
    torch.set_num_threads(args.threads)
    verifier = load_model(args.verifier, dtype=args.dtype)
    same = resolve_dtype(args.sample_dtype, "cpu") == resolve_dtype(args.dtype, "cpu")
    sampler = verifier if same else load_model(args.verifier, dtype=args.sample_dtype)
    decoder = Decoder(verifier)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "verifier": args.verifier,
        "dtype": verifier.dtype_name,
        "sample_dtype": sampler.dtype_name,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "settings": {key: str(value) for key, value in vars(args).items()},
        "languages": {},
        "rows": [],
    }
    for code in args.languages.split(","):
        language = get_language(code)
        work = args.workdir / code
        settings = SelfCorpusSettings(tokens=args.max_tokens)
        sampling_began = time.perf_counter()
        for total in generate_corpus(sampler, language, work / "samples", settings):
            minutes = (time.perf_counter() - sampling_began) / 60
            print(f"{code}: {total} tokens sampled ({minutes:.1f} min)", flush=True)
            if args.max_minutes is not None and minutes >= args.max_minutes:
                break
        samples = Shards(work / "samples").read()
        sampled = sum(len(s["ids"]) for s in samples)
        report["languages"][code] = {
            "sampled_tokens": sampled,
            "samples": len(samples),
            "sampling_minutes_logged": sum(s.get("seconds", 0.0) for s in samples) / 60,
            "sampling_cpu_minutes_logged": sum(s.get("cpu_seconds", 0.0) for s in samples) / 60,
        }
        if _out_of_time(began, args.max_wall_minutes):
            break
        prompts = [(task, p) for task in TASKS for p in build_prompts(language, task, limit=args.prompts)]
        corpus_model = work / "corpus-o4.ngram"
        train(verifier.tokenizer, corpus_text(language), order=4, out=corpus_model, show_progress=False)
        rows = {mode: acceptance(decoder, corpus_model, prompts, mode, args.new_tokens, args.gamma) for mode in MODES}
        base = {"language": code, "tokens": 0, "minutes": 0.0, "source": "corpus order 4"}
        _record(report, args.out, {**base, **_flat(rows)})
        for point in [p for p in points if p < sampled] + [sampled]:
            if _out_of_time(began, args.max_wall_minutes):
                break
            prefix, count, seconds, cpu = [], 0, 0.0, 0.0
            for sample in samples:
                if count >= point:
                    break
                prefix.append(sample)
                count += len(sample["ids"])
                seconds += sample.get("seconds", 0.0)
                cpu += sample.get("cpu_seconds", 0.0)
            path = work / f"distilled-{point}{'-mixed' if args.mix_corpus else ''}.ngram"
            t0 = time.perf_counter()
            # Counted as `polyspec ngram distill` counts them (`--mix` at its default weights).
            counted = sample_counts(prefix, args.order, fingerprint(verifier.tokenizer).vocab_size, eos_ids(verifier))
            mixed = corpus_text(language) if args.mix_corpus else []
            train(verifier.tokenizer, mixed, order=args.order, out=path, show_progress=False,
                  weight=SAMPLE_UNIT, counted=counted)  # fmt: skip
            train_seconds = time.perf_counter() - t0
            rows = {mode: acceptance(decoder, path, prompts, mode, args.new_tokens, args.gamma) for mode in MODES}
            row = {"language": code, "tokens": count, "minutes": seconds / 60, "cpu_minutes": cpu / 60,
                   "train_seconds": train_seconds, "source": "distilled", "mixed": args.mix_corpus,
                   **_flat(rows)}  # fmt: skip
            _record(report, args.out, row)
    report["load_average_after"] = os.getloadavg()
    report["wall_minutes"] = (time.perf_counter() - began) / 60
    _record(report, args.out, None)
    plot(report["rows"], args.out / "curve.png")
    before, after = report["load_average_before"], report["load_average_after"]
    print(f"done in {report['wall_minutes']:.1f} min; load average {before} -> {after}")


def _out_of_time(began: float, limit: float) -> bool:
    if (time.perf_counter() - began) / 60 < limit:
        return False
    print(f"stopping: the run has taken {limit} minutes", flush=True)
    return True


def _record(report: dict, out: Path, row: dict | None) -> None:
    if row is not None:
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
    write_atomic(out / "curve.json", json.dumps(report, indent=1) + "\n")


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
            xs, ys = [r["minutes"] for r in rows], [r[f"{mode}_acceptance"] for r in rows]
            (line,) = axis.plot(xs, ys, "o-", label=code)
            for r, x, y in zip(rows, xs, ys, strict=True):
                axis.annotate(f"{r['tokens'] / 1000:.0f}k", (x, y), textcoords="offset points", xytext=(0, 5),
                              fontsize=7, ha="center")  # fmt: skip
            base = next(r for r in results if r["language"] == code and r["source"] != "distilled")
            axis.axhline(base[f"{mode}_acceptance"], color=line.get_color(), linestyle=":", linewidth=1)
        axis.set_title(f"{mode} (dotted: corpus n-gram, order 4)")
        axis.set_xlabel("verifier sampling time (min, this CPU; labels: tokens)")
    axes[0].set_ylabel("acceptance rate (story + continuation)")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
