"""Where each language's drafters live under $POLYSPEC_HOME, and the bench names that find them.

    $POLYSPEC_HOME/distill/<language>/baseline   `distill init --language X ...`      draft-baseline
    $POLYSPEC_HOME/distill/<language>/task       `distill train --data translation`   distill-task
    $POLYSPEC_HOME/distill/<language>/general    `distill train --data monolingual`   distill-general
    $POLYSPEC_HOME/distill/cache                 the verifier's outputs, reused across runs

Light on imports: the benchmark resolves names through here before loading any model.
"""

from __future__ import annotations

from pathlib import Path

from polyspec.errors import UserError

BENCH_NAMES = {"draft-baseline": "baseline", "distill-task": "task", "distill-general": "general"}
DATA_KINDS = {"translation": "task", "monolingual": "general"}
# The small default setup (docs/DISTILL.md): the commands that make each drafter of a language.
COMMANDS = {
    "baseline": "polyspec distill init --language {code} --vocab-top 8192",
    "task": "polyspec distill train --language {code} --data translation",
    "general": "polyspec distill train --language {code} --data monolingual",
}


def distill_home() -> Path:
    from polyspec.assets.store import home

    return home() / "distill"


def drafter_dir(code: str, kind: str) -> Path:
    return distill_home() / code / kind


def cache_dir() -> Path:
    return distill_home() / "cache"


def bench_drafter_dir(name: str, language) -> Path:
    """The directory of a bench drafter name's drafter, or a UserError naming the missing command."""
    from polyspec.distill.checkpoint import is_drafter_dir

    kind = BENCH_NAMES.get(name)
    if kind is None:
        raise UserError(f"unknown drafter {name!r}: distilled drafters are {', '.join(BENCH_NAMES)} or distill:PATH")
    path = drafter_dir(language.code, kind)
    if not is_drafter_dir(path):
        steps = [COMMANDS[kind].format(code=language.code)]
        if kind != "baseline" and not is_drafter_dir(drafter_dir(language.code, "baseline")):
            steps.insert(0, COMMANDS["baseline"].format(code=language.code))
        raise UserError(f"no {name} drafter for {language.code!r} in {path}: run `{'` then `'.join(steps)}`")
    return path
