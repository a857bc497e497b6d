"""Turns benchmark records into report.md, results.csv and PNG plots.

Tables follow the study: one row per language, one column per drafter, for each task and
mode; the mean row carries a 95% confidence interval over prompts.

Provenance: records of one drafter name whose `drafter_source` differs (n-grams trained on
other corpora, other distillation settings) are never pooled. Coming from different results
files, they are reported side by side as `NAME [RUN]` (RUN: the file's directory); within one
file the report refuses them. Records written before `drafter_source` existed count as
unrecorded, which differs from any recorded model file. Old records without the newer fields
(trees, provenance, cost curves) load and show "-" there.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from polyspec.bench.grid import BENCH_DRAFTERS, record_key
from polyspec.bench.metrics import mean_ci95
from polyspec.bench.provenance import identity
from polyspec.bench.results import read_records
from polyspec.errors import UserError
from polyspec.files import atomic_path, write_atomic

NGRAM_DRAFTERS = ("ngram-bigram", "ngram", "ngram+context")
UNRECORDED = "unrecorded"  # the source of a record written before records carried one


def source_key(record: dict):
    return identity(record["drafter_source"]) if "drafter_source" in record else UNRECORDED


def run_labels(paths: list[Path]) -> list[str]:
    """A short name per results file: its directory, numbered where two share one."""
    names = [Path(p).resolve().parent.name or str(p) for p in paths]
    return [f"{name}#{names[:i].count(name) + 1}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def separate_sources(runs: list[tuple[str, list[dict]]]) -> set[str]:
    """Relabels, in place, the records of drafters whose sources differ as `NAME [RUN]`; returns
    the names relabelled. Refuses different sources of one drafter and language in one file."""
    seen: dict[tuple[str, str], set] = defaultdict(set)
    for label, records in runs:
        within: dict[tuple[str, str], set] = defaultdict(set)
        for r in records:
            within[(r["drafter"], r["language"])].add(source_key(r))
        for (drafter, language), keys in within.items():
            known = keys - {UNRECORDED}
            if len(known) > 1:
                raise UserError(
                    f"results of run {label!r}: drafter {drafter!r} in {language!r} comes from different model files "
                    f"({', '.join(sorted(str(k)[:12] for k in known))}): report them from separate runs"
                )
            seen[(drafter, language)] |= keys
    split = set()
    for (drafter, _), keys in seen.items():
        if keys - {UNRECORDED} <= {None}:
            keys = keys - {UNRECORDED}  # no model file anywhere: nothing to tell apart
        if len(keys) > 1:
            split.add(drafter)
    for label, records in runs:
        for r in records:
            if r["drafter"] in split:
                r["drafter"] = f"{r['drafter']} [{label}]"
    return split


def load(paths: Iterable[Path]) -> tuple[list[dict], dict]:
    """Records of several files (a later record with the same key wins, drafters of different
    sources kept apart: `separate_sources`) and their fertility tables."""
    paths = [Path(p) for p in paths]
    runs = list(zip(run_labels(paths), [read_records(p) for p in paths], strict=True))
    separate_sources(runs)
    by_key: dict[tuple, dict] = {}
    fertility: dict = {}
    for path, (_, records) in zip(paths, runs, strict=True):
        for record in records:
            by_key[record_key(record)] = record
        table = path.parent / "fertility.json"
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
    lines += adaptive_goals(records)
    lines += distilled_goals(records)
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


def mean_f(records: list[dict], drafter: str) -> float | None:
    values = [r["f_measured"] for r in records if r["drafter"] == drafter and r.get("f_measured") is not None]
    return sum(values) / len(values) if values else None


def is_fixed_chain(drafter: str, records: list[dict]) -> bool:
    """One of polyspec's own drafters that drafts chains of fixed length (not the router)."""
    if drafter in ("none", "hf-prompt-lookup") or drafter.startswith("adaptive"):
        return False
    return all(not r.get("tree") for r in records if r["drafter"] == drafter)


def adaptive_goals(records: list[dict]) -> list[str]:
    """Per task and mode: each router (`adaptive`, `adaptive-distill`) against the study's bigram,
    the best fixed chain drafter and transformers' prompt lookup (goal: at least as fast as each)."""
    lines = []
    for task in ordered({r["task"] for r in records}, ["translation", "story", "continuation"]):
        for mode in ordered({r["mode"] for r in records}, ["greedy", "sample"]):
            rs = [r for r in records if r["task"] == task and r["mode"] == mode]
            chains = [d for d in {r["drafter"] for r in rs} if is_fixed_chain(d, rs)]
            best, best_f = best_by_mean(rs, chains)
            rivals = [("ngram-bigram", mean_f(rs, "ngram-bigram"))]
            rivals.append((f"best fixed chain `{best}`" if best else "best fixed chain", best_f if best else None))
            rivals.append(("hf-prompt-lookup", mean_f(rs, "hf-prompt-lookup")))
            known = [f for _, f in rivals if f is not None]
            text = ", ".join(f"{name} {fmt(f)}x" for name, f in rivals if f is not None) or "nothing to compare"
            for router in ("adaptive", "adaptive-distill"):
                routed = mean_f(rs, router)
                if routed is None:
                    continue
                verdict = ("met" if all(routed >= f for f in known) else "not met") if known else "no rivals"
                trees = sorted({r.get("tree", 0) for r in rs if r["drafter"] == router})
                lines.append(
                    f"- {task}, {mode}: `{router}` (tree {'/'.join(map(str, trees))}) f = {routed:.2f}x against "
                    f"{text} (goal: at least each): **{verdict}**"
                )
    return lines


def pooled_alpha(records: list[dict], drafter: str) -> float | None:
    """Accepted over drafted tokens, summed over the drafter's records (not a mean of ratios)."""
    rs = [r for r in records if r["drafter"] == drafter and r.get("drafted") is not None]
    drafted = sum(r["drafted"] for r in rs)
    return sum(r["accepted"] for r in rs) / drafted if drafted else None


# Each n-gram distilled from the verifier and the corpus n-gram it stands in for.
DISTILLED_PAIRS = (("ngram-distill", "ngram"), ("ngram-distill+context", "ngram+context"))


def distilled_goals(records: list[dict]) -> list[str]:
    """Distilled n-grams against the corpus ones: sampled stories and continuations (acceptance
    >= 3x, chain f >= 1.3x) and greedy decoding (acceptance no lower on any task)."""
    lines = []
    free = [r for r in records if r["mode"] == "sample" and r["task"] in ("story", "continuation")]
    greedy = [r for r in records if r["mode"] == "greedy"]
    tasks = ordered({r["task"] for r in greedy}, ["translation", "story", "continuation"])
    for distilled, corpus in DISTILLED_PAIRS:
        ours, theirs, f = pooled_alpha(free, distilled), pooled_alpha(free, corpus), mean_f(free, distilled)
        if ours is not None and theirs is not None and f is not None:
            ratio = ours / theirs if theirs else math.inf
            ok = ratio >= 3.0 and f >= 1.3
            lines.append(
                f"- Sampled story + continuation: `{distilled}` acceptance {ours:.3f} vs `{corpus}` {theirs:.3f}, "
                f"ratio {ratio:.2f} (goal >= 3), f = {f:.2f}x (goal >= 1.3): **{'met' if ok else 'not met'}**"
            )
        cells = []
        for task in tasks:
            rs = [r for r in greedy if r["task"] == task]
            pair = pooled_alpha(rs, distilled), pooled_alpha(rs, corpus)
            if None not in pair:
                cells.append((task, *pair))
        if cells:
            text = ", ".join(f"{task} {ours:.3f} vs {theirs:.3f}" for task, ours, theirs in cells)
            ok = all(ours >= theirs for _, ours, theirs in cells)
            lines.append(
                f"- Greedy: `{distilled}` against `{corpus}` acceptance by task: {text} "
                f"(goal: no lower on any task): **{'met' if ok else 'not met'}**"
            )
    return lines


def tree_table(records: list[dict], drafters: list[str]) -> list[str]:
    """Per drafter: tree budgets, positions fed to the verifier and draft nodes kept per call."""
    lines = [
        "| drafter | tree budget | nodes verified per call | nodes accepted per call | tau |",
        "|---|---|---|---|---|",
    ]
    for d in drafters:
        rs = [r for r in records if r["drafter"] == d and r.get("nodes_per_call") is not None]
        if not rs:
            continue
        trees = "/".join(map(str, sorted({r.get("tree", 0) for r in rs})))
        accepted = [r["accepted_per_call"] for r in rs if r.get("accepted_per_call") is not None]
        lines.append(
            f"| {d} | {trees} | {fmt_ci([r['nodes_per_call'] for r in rs])} | "
            f"{fmt_ci(accepted) if accepted else '-'} | {fmt_ci([r['tau'] for r in rs if r.get('tau') is not None])} |"
        )
    return lines if len(lines) > 2 else []


def cost_curves(records: list[dict]) -> list[dict]:
    """The distinct verify-width cost curves (widths, seconds) the records' routers planned with."""
    curves, seen = [], set()
    for r in records:
        curve = r.get("verify_costs")
        if curve and (key := json.dumps(curve, sort_keys=True)) not in seen:
            seen.add(key)
            curves.append(curve)
    return curves


def curve_plot(curves: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for i, curve in enumerate(curves):
        ax.plot(curve["widths"], [1000 * s for s in curve["seconds"]], marker="o", label=f"curve {i + 1}")
    ax.set_xscale("log", base=2)
    widths = sorted({w for curve in curves for w in curve["widths"]})
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.minorticks_off()
    ax.set_xlabel("verify width (tokens fed in one forward)")
    ax.set_ylabel("ms per forward")
    ax.set_title("verifier forward time by width (adaptive drafting's cost curve)", fontsize=9)
    if len(curves) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def curve_section(curves: list[dict]) -> list[str]:
    if not curves:
        return []
    lines = ["", "## Verify cost by width", ""]
    lines.append(
        "The curve adaptive drafting plans with: the verifier's forward time by width, measured once per model, "
        "dtype, device and thread count, then followed by the step times the router observes."
    )
    for i, curve in enumerate(curves):
        points = zip(curve["widths"], curve["seconds"], strict=True)
        lines += ["", f"curve {i + 1}: " + ", ".join(f"width {w} {1000 * s:.1f} ms" for w, s in points)]
    lines += ["", "![verify cost by width](verify_costs.png)"]
    return lines


def route_section(records: list[dict]) -> list[str]:
    routes: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        if r.get("route"):
            routes[r["drafter"]].update(r["route"])
    lines = []
    for drafter, route in sorted(routes.items()):
        total = sum(route.values())
        shares = ", ".join(f"{part} {count / total:.0%}" for part, count in route.most_common())
        lines.append(f"- `{drafter}`: steps by the drafter that drafted them: {shares} ({total} steps)")
    return ["", "Routing:", "", *lines] if lines else []


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
        raise UserError("no records to report on")
    languages = ordered({r["language"] for r in records})
    drafters = ordered({r["drafter"] for r in records}, BENCH_DRAFTERS)
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
        "`hf-prompt-lookup` is transformers' own prompt lookup timed against transformers' plain generate. "
        "`adaptive` routes among the language's ngram, ngram+context and prompt lookup, drafting token trees where "
        "it can branch; `adaptive-distill` routes among ngram-distill, ngram-distill+context, ngram+context and "
        "prompt lookup. Drafters whose records come from different model files are reported per run: `NAME [RUN]`.",
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
    trees = tree_table(records, drafters)
    if trees:
        lines += ["", "## Trees and verify width", ""]
        lines += ["Per verifier call: positions fed (the pending token and every draft node) and draft nodes kept; "]
        lines[-1] += "tree budget 0 is a chain."
        lines += ["", *trees]
    lines += route_section(records)
    curves = cost_curves(records)
    lines += curve_section(curves)
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
    if curves:
        curve_plot(curves, out_dir / "verify_costs.png")
    write_csv(records, out_dir / "results.csv")
    report = out_dir / "report.md"
    write_atomic(report, "\n".join(lines))
    return report
