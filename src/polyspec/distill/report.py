"""The benchmark report's generalisation table: drafters distilled on translation, tested on
translation and on story generation, against the untrained drafter they started from."""

from __future__ import annotations

from collections import defaultdict

BASELINE, TASK, GENERAL = "draft-baseline", "distill-task", "distill-general"
GAIN_GOAL = 0.10  # alpha gain over the baseline that counts as a real improvement
LANGUAGES_GOAL = 4  # study languages that must show it on translation


def _means(records: list[dict]) -> dict[tuple, float]:
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        if r.get("alpha") is not None:
            cells[(r["mode"], r["language"], r["task"], r["drafter"])].append(r["alpha"])
    return {key: sum(values) / len(values) for key, values in cells.items()}


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def generalisation_section(records: list[dict]) -> list[str]:
    """Markdown lines; none when the records hold no distilled drafter next to its baseline."""
    from polyspec.assets.languages import STUDY_CODES

    drafters = {r["drafter"] for r in records}
    if BASELINE not in drafters or not drafters & {TASK, GENERAL}:
        return []
    means = _means(records)
    trained = [d for d in (TASK, GENERAL) if d in drafters]
    lines = [
        "",
        "## Distilled drafters: trained on translation, tested on stories",
        "",
        f"Acceptance rate alpha of the untrained `{BASELINE}` and of the distilled drafters on translation (the "
        f"task `{TASK}` was trained on) and on story generation (never trained on), with each one's gain over "
        "the baseline.",
    ]
    verdicts = []
    for mode in sorted({key[0] for key in means}):
        languages = sorted({key[1] for key in means if key[0] == mode})
        header = ["language"]
        for task in ("translation", "story"):
            header.append(f"{BASELINE} {task}")
            for d in trained:
                header += [f"{d} {task}", "gain"]
        lines += ["", f"### {mode}", "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        gains: dict[str, dict[str, float]] = defaultdict(dict)
        for language in languages:
            row = [language]
            for task in ("translation", "story"):
                base = means.get((mode, language, task, BASELINE))
                row.append(_fmt(base))
                for d in trained:
                    value = means.get((mode, language, task, d))
                    gain = value - base if value is not None and base is not None else None
                    row += [_fmt(value), _fmt(gain, signed=True)]
                    if gain is not None and d == TASK:
                        gains[task][language] = gain
            lines.append("| " + " | ".join(row) + " |")
        if TASK in trained and gains["translation"]:
            verdicts.append(_verdict(mode, gains, STUDY_CODES))
    if verdicts:
        lines += ["", *verdicts]
    return lines


def _verdict(mode: str, gains: dict[str, dict[str, float]], study: tuple[str, ...]) -> str:
    improved = sorted(lang for lang, gain in gains["translation"].items() if gain >= GAIN_GOAL)
    improved_study = [lang for lang in improved if lang in study]
    story = gains.get("story", {})
    carried = [lang for lang in improved if story.get(lang, -1.0) >= GAIN_GOAL]
    tested = [lang for lang in improved if lang in story]
    met = len(improved_study) >= LANGUAGES_GOAL
    text = (
        f"- {mode}: `{TASK}` raises translation alpha by >= {GAIN_GOAL:.2f} over `{BASELINE}` in "
        f"{len(improved_study)} study language(s) ({', '.join(improved_study) or 'none'}; goal >= {LANGUAGES_GOAL}): "
        f"**{'met' if met else 'not met'}**. "
    )
    if not tested:
        return text + "No story runs for those languages: whether the gain carries over is untested."
    mean_story = sum(story[lang] for lang in tested) / len(tested)
    return text + (
        f"On stories the same languages gain {mean_story:+.2f} on average; the gain carries over (>= {GAIN_GOAL:.2f}) "
        f"in {len(carried)} of {len(tested)} ({', '.join(carried) or 'none'})."
    )
