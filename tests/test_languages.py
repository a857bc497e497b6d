"""The language registry: the study's codes, user languages from files, tokenizer fertility."""

from __future__ import annotations

import pytest

from polyspec.assets import languages
from polyspec.assets.languages import Language, fertility, get_language, load_languages, register
from polyspec.errors import UserError


@pytest.fixture(autouse=True)
def clean_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(languages, "_registered", {})


def test_study_languages_and_their_udhr_codes():
    assert languages.STUDY_CODES == (
        "amh", "ber", "chr", "grn", "haw", "ibo", "npi", "oci", "que", "yor", "zgh", "zh",
    )  # fmt: skip
    codes = {code: get_language(code).udhr_code for code in (*languages.STUDY_CODES, "eng")}
    assert codes == {
        "amh": "amh", "ber": "071", "chr": "chr_uppercase", "grn": "gug", "haw": "haw", "ibo": "ibo",
        "npi": "nep", "oci": "lnc", "que": "quz", "yor": "yor", "zgh": "zgh", "zh": "cmn_hans", "eng": "eng",
    }  # fmt: skip
    assert get_language("zgh").script == "Tfng"
    assert get_language("chr").script == "Cher"
    assert not get_language("zh").spaced
    assert all(get_language(code).story_lead for code in codes)


def test_unknown_code_lists_known_ones():
    with pytest.raises(UserError, match=r"unknown language 'xyz': known languages are amh, ber, .*, eng"):
        get_language("xyz")


def test_resolve_languages():
    assert [lang.code for lang in languages.resolve_languages(None)] == list(languages.STUDY_CODES)
    assert [lang.code for lang in languages.resolve_languages("oci, zh")] == ["oci", "zh"]
    assert len(languages.resolve_languages("all")) == 13
    with pytest.raises(UserError, match="unknown language"):
        languages.resolve_languages(["oci", "nope"])


def test_register_a_language_from_files(tmp_path):
    corpus = tmp_path / "swh.txt"
    corpus.write_text("Habari ya asubuhi.\n")
    language = register(languages.language_from_files("swh", corpus=corpus, name="Swahili", script="Latn"))
    assert get_language("swh") == language
    assert language.corpus == corpus and language.parallel is None
    with pytest.raises(UserError, match="already registered"):
        register(language)
    with pytest.raises(UserError, match="already registered"):
        register(Language("oci", "Occitan", "Latn", "oci_1"))
    register(Language("oci", "Occitan", "Latn", "oci_1"), replace_existing=True)
    assert get_language("oci").udhr_code == "oci_1"


def test_language_needs_some_text(tmp_path):
    with pytest.raises(UserError, match="needs a UDHR code, a corpus file or a parallel file"):
        Language("xx", "X", "Latn")
    with pytest.raises(UserError, match="does not exist"):
        languages.language_from_files("xx", corpus=tmp_path / "missing.txt")
    with pytest.raises(UserError, match="must be a non-empty word"):
        Language("a b", "X", "Latn", "eng")


def test_languages_file_resolves_paths_next_to_it(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "c.txt").write_text("text\n")
    (tmp_path / "data" / "p.tsv").write_text("a\tb\n")
    path = tmp_path / "langs.toml"
    path.write_text(
        '[[language]]\ncode = "swh"\nname = "Swahili"\nscript = "Latn"\n'
        'corpus = "data/c.txt"\nparallel = "data/p.tsv"\nstory_lead = "Siku moja,"\n'
    )
    (language,) = load_languages(path)
    assert language.corpus == (tmp_path / "data" / "c.txt").resolve()
    assert language.parallel == (tmp_path / "data" / "p.tsv").resolve()
    assert language.story_lead == "Siku moja,"


def test_languages_file_in_home_is_read_automatically(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "x.txt").write_text("text\n")
    (home / "languages.toml").write_text('[[language]]\ncode = "xx"\ncorpus = "x.txt"\n')
    assert get_language("xx").name == "xx"
    assert "xx" in languages.known_languages()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[[language]]\ncode = "xx"\ncolour = "red"\nudhr_code = "eng"\n', "unknown keys"),
        ('[[language]]\nname = "X"\n', "has no code"),
        ("[[language]\n", "cannot read languages file"),
    ],
)
def test_bad_languages_file(tmp_path, content, message):
    path = tmp_path / "l.toml"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_languages(path)


def test_fertility_with_a_hugging_face_tokenizer(tokenizer):
    result = fertility(["w1 w2 w3", "w4 w5"], tokenizer)  # no <bos> counted
    assert (result.tokens, result.characters, result.words) == (5, 13, 5)
    assert result.tokens_per_word == 1.0
    assert result.tokens_per_char == pytest.approx(5 / 13)
    assert result.chars_per_token == pytest.approx(13 / 5)
    assert result.to_dict()["tokens_per_word"] == 1.0


def test_fertility_with_an_encode_method():
    class Bytes:
        def encode(self, text):
            return list(text.encode("utf-8"))

    result = fertility("ᏌᏊ ᎢᎦ", Bytes())
    assert (result.tokens, result.characters, result.words) == (13, 5, 2)  # 3 bytes per syllable, 1 per space
    assert fertility([], Bytes()).tokens_per_char == 0.0


def test_fertility_counts_ethiopic_word_spaces_as_breaks():
    class Chars:
        def encode(self, text):
            return list(text)

    result = fertility("ራሴ፡በቀጥታ፡ወይም። ነጻ", Chars())
    assert result.words == 4
