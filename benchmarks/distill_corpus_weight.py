"""How much the corpus split should weigh in the benchmark's distilled n-grams.

For each language, from the benchmark's own cached verifier samples (sampled first where the
cache has none, as `polyspec bench` does), one order-4 n-gram per weight in --weights: the
samples counted once, the corpus split's documents W times (what the benchmark's
`ngram-distill` does with W = DISTILL_CORPUS_WEIGHT). With --drawn-only, each weight also
gets a model that counts only the tokens drawn, not the verifier's kept candidates (the same
samples with their `top_ids` left out, as a log from before soft counts): soft counts against
hard ones. Then prints, per language, the `polyspec bench` command that measures them as
`ngram:PATH` drafters beside the corpus n-gram and `ngram-distill` (docs/NGRAM.md has the
results).

    .venv/bin/python benchmarks/distill_corpus_weight.py --languages npi,yor --weights 0,1,4,16 --out runs/distill-mix
    .venv/bin/python benchmarks/distill_corpus_weight.py --languages npi,yor --weights 16 --drawn-only \
        --out runs/distill-soft
"""

from __future__ import annotations

import argparse
from pathlib import Path

from polyspec.assets.store import home
from polyspec.bench.grid import BenchConfig
from polyspec.bench.runner import BenchRunner, corpus_documents, corpus_sources, resolve_grid_languages
from polyspec.ngram_distill import Shards, distill_ngram
from polyspec.specs import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--languages", default="npi,yor")
    parser.add_argument("--weights", default="0,1,4,16")  # 0: the samples alone
    parser.add_argument("--drawn-only", action="store_true", help="also count only the tokens drawn")
    parser.add_argument("--out", type=Path, default=Path("runs/distill-mix"))
    args = parser.parse_args()
    config = BenchConfig(languages=tuple(args.languages.split(",")))
    verifier = load_model(config.verifier, dtype=config.dtype, device=config.device)
    runner = BenchRunner(config, verifier, home() / "ngram", show_progress=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for language in resolve_grid_languages(config):
        runner.ngram_path("ngram-distill", language)  # the samples exist from here on
        samples = {"": runner.distilled.samples_dir(language)}
        if args.drawn_only:
            # Named after the source log (its cache key), so another verifier's copy is never reused.
            samples["-drawn"] = drawn_only(samples[""], args.out / f"{samples[''].stem}-drawn.samples")
        paths = []
        for weight in (int(w) for w in args.weights.split(",")):
            for suffix, samples_dir in samples.items():
                path = args.out / f"{language.code}-w{weight}{suffix}.ngram"
                report = distill_ngram(
                    verifier, language, config.ngram_order, path, runner.distilled.settings,
                    mix=corpus_documents(language), corpus_weight=weight,
                    samples_dir=samples_dir, metadata={"corpus": corpus_sources(language)},
                )  # fmt: skip
                print(f"{language.code}, corpus weight {weight}{suffix}: {path} ({report.tokens:,} tokens counted)")
                paths.append(path)
        drafters = ",".join(["none", "ngram", "ngram-distill", *(f"ngram:{p}" for p in paths)])
        print(
            f".venv/bin/polyspec bench --languages {language.code} --tasks story,continuation,translation "
            f"--modes greedy,sample --drafters {drafters} --limit 3 --out {args.out}/bench-{language.code}"
        )


def drawn_only(samples_dir: Path, out: Path) -> Path:
    """A copy of a sample log without the kept candidates: its tokens count the whole unit."""
    source, copy = Shards(samples_dir).read(), Shards(out)
    if len(copy.read()) != len(source):  # a fresh or torn copy: written again, in one write
        copy.path.unlink(missing_ok=True)
        copy.append([{k: v for k, v in s.items() if k not in ("top_ids", "top_probs")} for s in source])
    return out


if __name__ == "__main__":
    main()
