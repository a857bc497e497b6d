"""The languages of the study, plus English, and the languages users add from their own files.

UDHR codes (see docs/ASSETS.md for the reasons):
- ber -> 071 (Kabyle): the Berber language of the study's Tatoeba data; `tzm` would be Central
  Atlas Tamazight in Latin script;
- chr -> chr_uppercase: the upper-case syllabary is the script Cherokee is usually written in;
  the lower-case letters of `chr_cased` fall apart into single bytes in Gemma's tokenizer;
- oci -> lnc (Languedocien): `oci_1` is Francoprovençal, not Occitan;
- grn -> gug, npi -> nep, que -> quz (Cusco), zh -> cmn_hans.

A user language is a `Language` with its own files: `corpus` (monolingual text, one paragraph per
line: the training split) and `parallel` (TSV of English source and reference: the evaluation
split). Register one with `register`, or list several in a TOML file (`load_languages`);
$POLYSPEC_HOME/languages.toml, when it exists, is read automatically.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from polyspec.errors import UserError

USER_LANGUAGES_FILE = "languages.toml"
# Words end at whitespace, and in Ethiopic script (Amharic) at the word space and full stop.
_WORD_BREAK = re.compile(r"[\s\u1361\u1362]+")


@dataclass(frozen=True)
class Language:
    code: str
    name: str  # as written in prompts: "Write a story in {name} ..."
    script: str  # ISO 15924
    udhr_code: str | None = None
    corpus: Path | None = None  # replaces the UDHR training split
    parallel: Path | None = None  # replaces the UDHR evaluation split
    dataset_build: str | None = None  # extra training text from the dataset-build corpora
    story_lead: str | None = None  # a story opening ("One day,") that sets the language
    spaced: bool = True  # words are separated by spaces (not so in Chinese)
    study: bool = field(default=False, compare=False)  # one of the study's 12 languages

    def __post_init__(self) -> None:
        if not self.code or any(ch.isspace() or ch in "/\\" for ch in self.code):
            raise UserError(f"language code {self.code!r} must be a non-empty word")
        for name in ("corpus", "parallel"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value).expanduser())
        if self.udhr_code is None and self.parallel is None and self.corpus is None:
            raise UserError(f"language {self.code!r} needs a UDHR code, a corpus file or a parallel file")


BUILTIN = (
    Language("amh", "Amharic", "Ethi", "amh", story_lead="አንድ ቀን", study=True),
    Language("ber", "Kabyle", "Latn", "071", story_lead="Yiwen n wass,", study=True),
    Language("chr", "Cherokee", "Cher", "chr_uppercase", story_lead="ᏌᏊ ᎢᎦ,", study=True),
    Language("grn", "Guarani", "Latn", "gug", story_lead="Peteĩ árape,", study=True),
    Language("haw", "Hawaiian", "Latn", "haw", story_lead="I kekahi lā,", study=True),
    Language("ibo", "Igbo", "Latn", "ibo", story_lead="Otu ụbọchị,", study=True),
    Language("npi", "Nepali", "Deva", "nep", story_lead="एक दिन,", study=True),
    Language("oci", "Occitan", "Latn", "lnc", story_lead="Un jorn,", study=True),
    Language("que", "Quechua", "Latn", "quz", story_lead="Huk p'unchaw,", study=True),
    Language("yor", "Yoruba", "Latn", "yor", story_lead="Ní ọjọ́ kan,", study=True),
    Language("zgh", "Standard Moroccan Tamazight", "Tfng", "zgh", story_lead="ⵢⴰⵏ ⵡⴰⵙⵙ,", study=True),
    Language("zh", "Chinese", "Hans", "cmn_hans", dataset_build="zho", story_lead="有一天，", spaced=False, study=True),
    Language("eng", "English", "Latn", "eng", dataset_build="eng", story_lead="One day,"),
)
STUDY_CODES = tuple(language.code for language in BUILTIN if language.study)

_registered: dict[str, Language] = {}


def register(language: Language, replace_existing: bool = False) -> Language:
    """Add a language for this process (built-in codes can be overridden with replace_existing)."""
    if not replace_existing and language.code in known_languages():
        raise UserError(f"language {language.code!r} is already registered")
    _registered[language.code] = language
    return language


def language_from_files(
    code: str,
    corpus: Path | str | None = None,
    parallel: Path | str | None = None,
    name: str | None = None,
    script: str = "Zyyy",
    **options,
) -> Language:
    """A Language from a corpus file and/or a parallel TSV; `options` are other Language fields."""
    for path in (corpus, parallel):
        if path is not None and not Path(path).expanduser().is_file():
            raise UserError(f"language {code!r}: file {str(path)!r} does not exist")
    return Language(code, name or code, script, corpus=corpus, parallel=parallel, **options)


def load_languages(path: Path) -> list[Language]:
    """Languages from a TOML file of [[language]] tables; relative paths are relative to the file.

    [[language]]
    code = "swh"
    name = "Swahili"
    script = "Latn"
    corpus = "swahili.txt"
    parallel = "swahili-en.tsv"
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read languages file {str(path)!r}: {exc}") from exc
    allowed = {f.name for f in fields(Language)} - {"study"}
    languages = []
    for index, table in enumerate(data.get("language", [])):
        unknown = set(table) - allowed
        if unknown or "code" not in table:
            problem = f"unknown keys {sorted(unknown)}" if unknown else "no code"
            raise UserError(f"{path}: language #{index + 1} has {problem}")
        for key in ("corpus", "parallel"):
            if key in table:
                table[key] = (path.parent / Path(table[key]).expanduser()).resolve()
        table.setdefault("name", table["code"])
        table.setdefault("script", "Zyyy")
        languages.append(language_from_files(**table))
    return languages


def _user_file_languages() -> dict[str, Language]:
    from polyspec.assets.store import home

    path = home() / USER_LANGUAGES_FILE
    if not path.is_file():
        return {}
    return {language.code: language for language in load_languages(path)}


def known_languages() -> dict[str, Language]:
    """Built-ins, then $POLYSPEC_HOME/languages.toml, then `register`ed ones (later ones win)."""
    merged = {language.code: language for language in BUILTIN}
    merged.update(_user_file_languages())
    merged.update(_registered)
    return merged


def get_language(code: str | Language) -> Language:
    if isinstance(code, Language):
        return code
    languages = known_languages()
    if code not in languages:
        raise UserError(f"unknown language {code!r}: known languages are {', '.join(languages)}")
    return languages[code]


def resolve_languages(codes: Iterable[str] | str | None) -> list[Language]:
    """'study' (or None) -> the 12 study languages; 'all' -> every known one; else each code."""
    if codes is None or codes == "study":
        return [get_language(code) for code in STUDY_CODES]
    if codes == "all":
        return list(known_languages().values())
    if isinstance(codes, str):
        codes = [part.strip() for part in codes.split(",") if part.strip()]
    return [get_language(code) for code in codes]


def with_files(language: Language, corpus: Path | None = None, parallel: Path | None = None) -> Language:
    """The same language reading its text from user files instead of the UDHR."""
    return replace(language, corpus=corpus or language.corpus, parallel=parallel or language.parallel)


@dataclass(frozen=True)
class Fertility:
    """How finely a tokenizer cuts a text: more tokens per word means slower, costlier decoding."""

    tokens: int
    characters: int
    words: int  # runs between spaces (and Ethiopic word spaces); meaningless for unspaced scripts

    @property
    def tokens_per_char(self) -> float:
        return self.tokens / self.characters if self.characters else 0.0

    @property
    def tokens_per_word(self) -> float:
        return self.tokens / self.words if self.words else 0.0

    @property
    def chars_per_token(self) -> float:
        return self.characters / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "characters": self.characters,
            "words": self.words,
            "tokens_per_char": self.tokens_per_char,
            "tokens_per_word": self.tokens_per_word,
            "chars_per_token": self.chars_per_token,
        }


def fertility(texts: str | Iterable[str], tokenizer) -> Fertility:
    """Token counts of `texts` (no special tokens) under a Hugging Face tokenizer or any object
    with `encode(text) -> list[int]`."""
    if isinstance(texts, str):
        texts = [texts]
    tokens = characters = words = 0
    for text in texts:
        tokens += len(_encode(tokenizer, text))
        characters += len(text)
        words += len([word for word in _WORD_BREAK.split(text) if word])
    return Fertility(tokens, characters, words)


def _encode(tokenizer, text: str) -> list[int]:
    if callable(tokenizer) and hasattr(tokenizer, "convert_ids_to_tokens"):
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(tokenizer.encode(text))
