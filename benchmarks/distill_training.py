"""Training curves of the distilled drafters: loss and top-1 agreement with the verifier per step.

Reads every `<language>/<kind>/training-log.jsonl` under the drafter store ($POLYSPEC_HOME/distill,
written by `polyspec distill train`) and writes a markdown table (first and last 10 steps, seconds
per step) and a PNG with one curve per language, task-distilled and general-domain side by side.

    .venv/bin/python benchmarks/distill_training.py --out docs/results/distill
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from polyspec.distill.store import distill_home

KINDS = {"task": "translation (distill-task)", "general": "monolingual (distill-general)"}


def read_logs(root: Path) -> dict[tuple[str, str], list[dict]]:
    logs = {}
    for path in sorted(root.glob("*/*/training-log.jsonl")):
        kind, language = path.parent.name, path.parent.parent.name
        if kind in KINDS:
            logs[(language, kind)] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return logs


def mean(records: list[dict], key: str) -> float:
    return sum(r[key] for r in records) / len(records)


def table(logs: dict[tuple[str, str], list[dict]]) -> list[str]:
    lines = [
        "| language | data | steps | loss, first 10 | loss, last 10 | top-1, first 10 | top-1, last 10 | s/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (language, kind), log in sorted(logs.items(), key=lambda item: (item[0][1], item[0][0])):
        head, tail = log[:10], log[-10:]
        lines.append(
            f"| {language} | {kind} | {len(log)} | {mean(head, 'loss'):.2f} | {mean(tail, 'loss'):.3f} "
            f"| {mean(head, 'top1'):.3f} | {mean(tail, 'top1'):.3f} | {mean(log, 'seconds'):.2f} |"
        )
    return lines


def plot(logs: dict[tuple[str, str], list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(KINDS), figsize=(11, 4), sharey=True)
    for axis, (kind, title) in zip(axes, KINDS.items(), strict=True):
        for (language, logged_kind), log in sorted(logs.items()):
            if logged_kind == kind:
                axis.plot([r["step"] for r in log], [r["top1"] for r in log], label=language, linewidth=1)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("top-1 agreement with the verifier (batch)")
    axes[-1].legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=distill_home())
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logs = read_logs(args.store)
    if not logs:
        raise SystemExit(f"no training logs under {args.store}: train drafters with `polyspec distill train` first")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "training.md").write_text("\n".join(table(logs)) + "\n", encoding="utf-8")
    plot(logs, args.out / "training.png")
    print(f"wrote {args.out / 'training.md'} and {args.out / 'training.png'} ({len(logs)} runs)")


if __name__ == "__main__":
    main()
