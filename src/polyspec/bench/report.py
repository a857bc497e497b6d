"""Turns benchmark records into report.md, results.csv and PNG plots.

Tables follow the study: one row per language, one column per drafter, for each task and
mode; the mean row carries a 95% confidence interval over prompts.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from polyspec.bench.grid import DEFAULT_DRAFTERS, record_key
from polyspec.bench.metrics import mean_ci95
from polyspec.bench.results import read_records
from polyspec.files import atomic_path, write_atomic

NGRAM_DRAFTERS = ("ngram-bigram", "ngram", "ngram+context")


def load(paths: Iterable[Path]) -> tuple[list[dict], dict]:
    """Records of several files (a later record with the same key wins) and their fertility tables."""
    by_key: dict[tuple, dict] = {}
    fertility: dict = {}
    for path in paths:
        for record in read_records(Path(path)):
            by_key[record_key(record)] = record
        table = Path(path).parent / "fertility.json"
        if table.exists():
            fertility.update(json.loads(table.read_text(encoding="utf-8")))
    return list(by_key.values()), fertility


def ordered(values: Iterable[str], preferred: Iterable[str] = ()) -> list[str]:
    values = set(values)
    first = [v for v in preferred if v in values]
    return first + sorted(values - set(first))


def fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def fmt_ci(values: list[float], digits: int = 2) -> str:
    mean, half = mean_ci95(values)
    return f"{fmt(mean, digits)} ± {fmt(half, digits)}"


def metric_table(records: list[dict], metric: str, languages: list[str], drafters: list[str]) -> list[str]:
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        if r.get(metric) is not None:
            cells[(r["language"], r["drafter"])].append(r[metric])
    lines = ["| language | " + " | ".join(drafters) + " |", "|---" * (len(drafters) + 1) + "|"]
    for language in languages:
        row = [fmt(mean_ci95(cells[(language, d)])[0]) for d in drafters]
        lines.append(f"| {language} | " + " | ".join(row) + " |")
    means = []
    for d in drafters:
        values = [r[metric] for r in records if r["drafter"] == d and r.get(metric) is not None]
        means.append(fmt_ci(values) if values else "-")
    lines.append("| **mean ± 95% CI** | " + " | ".join(means) + " |")
    return lines


def best_by_mean(records: list[dict], drafters: Iterable[str]) -> tuple[str | None, float]:
    best, best_value = None, -math.inf
    for d in drafters:
        values = [r["f_measured"] for r in records if r["drafter"] == d]
        if values and (mean := sum(values) / len(values)) > best_value:
            best, best_value = d, mean
    return best, best_value


def goals(records: list[dict]) -> list[str]:
    """The project's speed goals, checked against these records, whatever the outcome."""
    lines = []
    own = [d for d in {r["drafter"] for r in records} if d not in ("none", "hf-prompt-lookup")]
    translation = [r for r in records if r["task"] == "translation"]
    hf = [r["f_measured"] for r in translation if r["drafter"] == "hf-prompt-lookup"]
    best, best_f = best_by_mean(translation, own)
    if hf and best:
        hf_f = sum(hf) / len(hf)
        ok = best_f >= 1.15 * hf_f
        lines.append(
            f"- Translation: best polyspec drafter `{best}` f = {best_f:.2f}x vs transformers' prompt lookup "
            f"{hf_f:.2f}x: ratio {best_f / hf_f:.2f} (goal >= 1.15): **{'met' if ok else 'not met'}**"
        )
    free = [r for r in records if r["task"] in ("story", "continuation")]
    best, best_f = best_by_mean(free, [d for d in own if d.startswith("ngram")])
    if best:
        per_language = defaultdict(list)
        for r in free:
            if r["drafter"] == best:
                per_language[r["language"]].append(r["f_measured"])
        worst = min(((sum(v) / len(v), k) for k, v in per_language.items()))
        ok = best_f >= 1.5 and worst[0] >= 1.0
        lines.append(
            f"- Story + continuation: best n-gram drafter `{best}` mean f = {best_f:.2f}x (goal >= 1.5), "
            f"lowest language {worst[1]} {worst[0]:.2f}x (goal >= 1.0): **{'met' if ok else 'not met'}**"
        )
    pairs = [
        (r["f_predicted"], r["f_measured"])
        for r in records
        if r.get("f_predicted") and r["drafter"] != "none" and r.get("f_measured")
    ]
    if pairs:
        error = sum(abs(p - m) / m for p, m in pairs) / len(pairs)
        lines.append(
            f"- Prediction: mean |f_predicted - f_measured| / f_measured = {error:.1%} over {len(pairs)} records "
            f"(goal <= 15%): **{'met' if error <= 0.15 else 'not met'}**"
        )
    overhead = [r["harness_seconds"] / r["generation_seconds"] for r in records if r.get("harness_seconds") is not None]
    if overhead:
        share = sum(overhead) / len(overhead)
        lines.append(
            f"- Harness overhead: {share:.2%} of generation time per prompt (goal <= 2%): "
            f"**{'met' if share <= 0.02 else 'not met'}**"
        )
    return lines


def correlation(records: list[dict]) -> tuple[list[tuple[float, float]], dict]:
    from scipy import stats

    points = [(r["alpha"], r["chrf"]) for r in records if r.get("chrf") is not None and r.get("alpha") is not None]
    if len(points) < 3:
        return points, {}
    alphas, chrfs = zip(*points, strict=True)
    if len(set(alphas)) < 2 or len(set(chrfs)) < 2:
        return points, {}
    pearson, spearman = stats.pearsonr(alphas, chrfs), stats.spearmanr(alphas, chrfs)
    return points, {
        "pearson_r": float(pearson.statistic),
        "pearson_p": float(pearson.pvalue),
        "spearman_r": float(spearman.statistic),
        "spearman_p": float(spearman.pvalue),
        "n": len(points),
    }


def write_csv(records: list[dict], path: Path) -> None:
    columns = ordered({k for r in records for k in r}, ["language", "task", "item", "mode", "drafter", "gamma"])
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for r in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in r.items()})


def bar_plot(records, metric: str, languages, drafters, path: Path, ylabel: str, reference: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / max(len(drafters), 1)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(languages) + 2), 4))
    for i, d in enumerate(drafters):
        means = []
        for language in languages:
            values = [r[metric] for r in records if r["language"] == language and r["drafter"] == d]
            values = [v for v in values if v is not None]
            means.append(sum(values) / len(values) if values else 0.0)
        ax.bar([x + i * width for x in range(len(languages))], means, width, label=d)
    if reference is not None:
        ax.axhline(reference, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks([x + width * (len(drafters) - 1) / 2 for x in range(len(languages))], languages)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scatter_plot(points, stats_: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    if points:
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=12, alpha=0.6)
    title = "chrF vs acceptance rate"
    if stats_:
        title += f"\nPearson r={stats_['pearson_r']:.2f} (p={stats_['pearson_p']:.2g}), "
        title += f"Spearman r={stats_['spearman_r']:.2f} (p={stats_['spearman_p']:.2g})"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("alpha")
    ax.set_ylabel("chrF")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(paths: list[Path], out_dir: Path) -> Path:
    records, fertility = load(paths)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not records:
        from polyspec.errors import UserError

        raise UserError("no records to report on")
    languages = ordered({r["language"] for r in records})
    drafters = ordered({r["drafter"] for r in records}, DEFAULT_DRAFTERS)
    first = records[0]
    lines = [
        "# polyspec benchmark report",
        "",
        f"{len(records)} records; verifier `{first['verifier']}`, {first['dtype']}, {first['device']}; "
        f"polyspec {first['version']} (commit {', '.join(sorted({r['commit'] for r in records}))}); "
        f"gammas {sorted({r['gamma'] for r in records if r['gamma']})}; "
        f"max load average during the runs {max(r.get('load', 0) for r in records):.2f}.",
        "",
        "alpha: acceptance rate (Leviathan); f: measured speedup, plain seconds / speculative seconds, for the same "
        "prompt and length in the same process. `none` is plain decoding timed against itself (timing noise); "
        "`hf-prompt-lookup` is transformers' own prompt lookup timed against transformers' plain generate.",
        "",
        "## Goals",
        "",
        *goals(records),
        "",
        "## Summary by drafter",
        "",
        "| drafter | alpha | f measured | f predicted | c | tau | chrF | copy4 | distinct2 | greedy identical "
        "| first divergence |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in drafters:
        rs = [r for r in records if r["drafter"] == d]

        def col(key, rs=rs):
            return (
                fmt_ci([r[key] for r in rs if r.get(key) is not None])
                if any(r.get(key) is not None for r in rs)
                else "-"
            )

        greedy = [r for r in rs if r["mode"] == "greedy"]
        same = f"{sum(r['identical'] for r in greedy)}/{len(greedy)}" if greedy else "-"
        # Where greedy outputs part (bfloat16 near-ties), as token positions.
        diverged = sorted(r["first_divergence"] for r in greedy if r.get("first_divergence") is not None)
        where = ", ".join(map(str, diverged)) if diverged else "-"
        c_values = [r["c"] for r in rs if r.get("c") is not None]
        c_text = f"{sum(c_values) / len(c_values):.1e}" if c_values else "-"
        lines.append(
            f"| {d} | {col('alpha')} | {col('f_measured')} | {col('f_predicted')} | {c_text} | {col('tau')} | "
            f"{col('chrf')} | {col('copy4')} | {col('distinct2')} | {same} | {where} |"
        )
    for task in ordered({r["task"] for r in records}, ["translation", "story", "continuation"]):
        for mode in ordered({r["mode"] for r in records}, ["greedy", "sample"]):
            rs = [r for r in records if r["task"] == task and r["mode"] == mode]
            if not rs:
                continue
            task_languages = [lang for lang in languages if any(r["language"] == lang for r in rs)]
            lines += ["", f"## {task}, {mode}", "", "Acceptance rate alpha:", ""]
            lines += metric_table(rs, "alpha", task_languages, [d for d in drafters if d != "hf-prompt-lookup"])
            lines += ["", "Measured speedup f:", ""]
            lines += metric_table(rs, "f_measured", task_languages, drafters)
    from polyspec.distill.report import generalisation_section

    lines += generalisation_section(records)
    points, corr = correlation([r for r in records if r["drafter"] not in ("none", "hf-prompt-lookup")])
    lines += ["", "## Quality and acceptance", ""]
    if corr:
        lines.append(
            f"chrF against alpha over {corr['n']} records: Pearson r = {corr['pearson_r']:.2f} "
            f"(p = {corr['pearson_p']:.2g}), Spearman r = {corr['spearman_r']:.2f} (p = {corr['spearman_p']:.2g})."
        )
    else:
        lines.append("Too few records with a reference to correlate chrF and alpha.")
    if fertility:
        lines += ["", "## Tokenizer fertility (corpus split)", ""]
        names = ordered({name for row in fertility.values() for name in row}, ["verifier"])
        lines.append("| language | " + " | ".join(f"{n} tokens/char | {n} tokens/word" for n in names) + " |")
        lines.append("|---" * (1 + 2 * len(names)) + "|")
        for code in ordered(fertility, languages):
            cells = []
            for n in names:
                f = fertility[code].get(n, {})
                cells += [fmt(f.get("tokens_per_char")), fmt(f.get("tokens_per_word"))]
            lines.append(f"| {code} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Plots",
        "",
        "![alpha by language](alpha_by_language.png)",
        "![f by language](f_by_language.png)",
        "![chrF vs alpha](chrf_vs_alpha.png)",
        "",
    ]
    spec_drafters = [d for d in drafters if d not in ("none", "hf-prompt-lookup")]
    bar_plot(records, "alpha", languages, spec_drafters, out_dir / "alpha_by_language.png", "acceptance rate", None)
    bar_plot(records, "f_measured", languages, drafters, out_dir / "f_by_language.png", "measured speedup", 1.0)
    scatter_plot(points, corr, out_dir / "chrf_vs_alpha.png")
    write_csv(records, out_dir / "results.csv")
    report = out_dir / "report.md"
    write_atomic(report, "\n".join(lines))
    return report
