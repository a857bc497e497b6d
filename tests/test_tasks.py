"""Benchmark prompts and splits: the corpus never holds evaluation text, prompts are well formed."""

from __future__ import annotations

import re

import pytest
from fixtures import install_fake_udhr, paragraph_text

from polyspec import tasks
from polyspec.assets import languages
from polyspec.assets.languages import Language, language_from_files
from polyspec.errors import UserError
from polyspec.tasks import build_prompts, copy4, corpus_text, distinct2, held_out

FAKE_LANGUAGES = ("oci", "ber", "chr", "zh", "yor")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    root = tmp_path / "home"
    monkeypatch.setenv("POLYSPEC_HOME", str(root))
    monkeypatch.setattr(languages, "_registered", {})
    # yor: article 2 and 23 have other paragraph counts than English
    install_fake_udhr(root, overrides={"yor": {2: 1, 23: 3}})
    return root


def article_of(text: str) -> int:
    match = re.search(r"article (\d+)|第(\d+)条", text)
    return int(match.group(1) or match.group(2))


@pytest.mark.parametrize("code", FAKE_LANGUAGES)
def test_corpus_and_held_out_splits_are_disjoint(code):
    corpus = corpus_text(code)
    items = held_out(code)
    assert corpus and items
    assert {article_of(p) for p in corpus} == set(range(21))  # preamble and articles 1-20
    assert {article_of(item.target) for item in items} == set(range(21, 31))
    held_texts = {item.target for item in items} | {item.source for item in items}
    for paragraph in corpus:
        assert not any(text in paragraph or paragraph in text for text in held_texts)


def test_split_articles_are_disjoint_and_cover_the_declaration():
    assert set(tasks.CORPUS_ARTICLES).isdisjoint(tasks.HELD_OUT_ARTICLES)
    assert set(tasks.CORPUS_ARTICLES) | set(tasks.HELD_OUT_ARTICLES) == set(range(31))


def test_examples_vary_with_item_and_seed():
    def examples(seed):
        prompts = build_prompts("oci", "translation", seed=seed, shots=1)
        return {p.item: re.search(r"^Occitan: (.*)$", p.text, flags=re.M).group(1) for p in prompts}

    assert len(set(examples(0).values())) > 1
    assert examples(0) != examples(1)  # the same item gets other examples under another seed


def test_uses_the_study_udhr_codes():
    assert corpus_text("oci")[0] == paragraph_text("lnc", 0, 0)
    assert corpus_text("ber")[0] == paragraph_text("071", 0, 0)
    assert held_out("chr")[0].target == paragraph_text("chr_uppercase", 21, 0)


def test_held_out_aligns_by_paragraph_or_whole_article():
    items = {item.item: item for item in held_out("yor")}
    assert "udhr:21.1" in items and "udhr:21.3" in items
    assert "udhr:23" in items and "udhr:23.1" not in items  # counts differ: the whole article
    assert items["udhr:23"].source == " ".join(paragraph_text("eng", 23, i) for i in range(2))
    assert items["udhr:21.2"].source == paragraph_text("eng", 21, 1)
    assert items["udhr:21.2"].target == paragraph_text("yor", 21, 1)


def test_translation_prompts():
    prompts = build_prompts("oci", "translation", limit=5, seed=3, shots=2)
    assert len(prompts) == 5
    assert len({p.item for p in prompts}) == 5
    for prompt in prompts:
        assert prompt.task == "translation" and prompt.language == "oci"
        assert prompt.stop_strings == ("\n",)
        assert prompt.text.startswith("Translate from English to Occitan.\n\n")
        assert prompt.text.endswith(f"English: {prompt.source}\nOccitan:")  # the source comes last
        article, paragraph = map(int, prompt.item.removeprefix("udhr:").split("."))
        assert prompt.reference == paragraph_text("lnc", article, paragraph - 1)
        assert prompt.source == paragraph_text("eng", article, paragraph - 1)
        shots = re.findall(r"^Occitan: (.*)$", prompt.text, flags=re.M)
        assert len(shots) == 2
        item_article = article_of(prompt.source)
        for shot in shots:
            assert article_of(shot) != item_article  # examples come from another article
            assert 21 <= article_of(shot) <= 30  # never from the corpus split
        assert prompt.reference not in prompt.text


def test_prompts_are_reproducible_and_seeded():
    first = build_prompts("ber", "translation", limit=4, seed=1)
    assert first == build_prompts("ber", "translation", limit=4, seed=1)
    assert [p.item for p in first] != [p.item for p in build_prompts("ber", "translation", limit=4, seed=2)]
    # languages aligned with English get the same items for one seed
    assert [p.item for p in first] == [p.item for p in build_prompts("chr", "translation", limit=4, seed=1)]


def test_zero_shot_and_too_many_shots():
    (prompt,) = build_prompts("oci", "translation", limit=1, shots=0)
    assert prompt.text == f"Translate from English to Occitan.\n\nEnglish: {prompt.source}\nOccitan:"
    with pytest.raises(UserError, match="only .* held-out items can serve"):
        build_prompts("oci", "translation", limit=1, shots=50)


def test_story_prompts():
    prompts = build_prompts("yor", "story", limit=30, seed=0)
    assert len(prompts) == 30 and len({p.item for p in prompts}) == 30
    for prompt in prompts:
        assert prompt.reference is None and prompt.stop_strings == ("\n\n",)
        assert re.fullmatch(r"Write a story in Yoruba about an? [a-z ]+\.\n\nNí ọjọ́ kan,", prompt.text)
    texts = {p.item: p.text for p in prompts}
    assert "about an orange cat." in texts["story:orange-cat"]
    assert "about a brave lion." in texts["story:brave-lion"]


def test_continuation_prompts_cut_held_out_paragraphs():
    for code in ("oci", "zh"):
        prompts = build_prompts(code, "continuation", seed=0)
        assert prompts
        targets = {item.item: item.target for item in held_out(code)}
        for prompt in prompts:
            assert prompt.stop_strings == ("\n",)
            assert prompt.reference and prompt.text
            joiner = " " if languages.get_language(code).spaced else ""
            assert prompt.text + joiner + prompt.reference == targets[prompt.item]
            assert len(prompt.text) < len(targets[prompt.item]) * 0.6


def test_opening_length():
    assert tasks.opening_length("one two three four five", True) is None  # too short to cut
    text = "one two three four five six seven eight nine ten"
    assert text[: tasks.opening_length(text, True)] == "one two three four"
    assert tasks.opening_length("短", False) is None


def test_user_files_replace_the_udhr(tmp_path):
    parallel = tmp_path / "swh.tsv"
    parallel.write_text("source\treference\nGood morning.\tHabari ya asubuhi.\nThank you.\tAsante.\nWater.\tMaji.\n")
    corpus = tmp_path / "swh.txt"
    corpus.write_text("Leo ni siku nzuri.\n\nNasema: habari ya  ASUBUHI. Karibu.\nAsante\nKaribu sana.\n")
    languages.register(language_from_files("swh", corpus=corpus, parallel=parallel, name="Swahili"))
    # the line holding a reference (case and spacing aside) is dropped; "Asante" is shorter than
    # the 20 characters below which a corpus line inside a reference is kept
    assert corpus_text("swh") == ["Leo ni siku nzuri.", "Asante", "Karibu sana."]
    prompts = build_prompts("swh", "translation", seed=0)
    assert sorted(p.item for p in prompts) == ["tsv:2", "tsv:3", "tsv:4"]
    for prompt in prompts:
        assert prompt.text.endswith(f"English: {prompt.source}\nSwahili:")
        assert f"Swahili: {prompt.reference}" not in prompt.text


def test_user_corpus_for_a_built_in_language_is_still_filtered(tmp_path):
    corpus = tmp_path / "oci.txt"
    leaked = paragraph_text("lnc", 25, 0)
    corpus.write_text(f"un tèxt nòu\n{leaked}\n")
    languages.register(languages.with_files(languages.get_language("oci"), corpus=corpus), replace_existing=True)
    assert corpus_text("oci") == ["un tèxt nòu"]


def test_dataset_build_text_joins_the_corpus(home):
    from fixtures import install_fake_asset

    install_fake_asset("dataset_build", {"zho.txt": "第一段。\n\n第二段。\n"})
    corpus = corpus_text("zh")
    assert corpus[-2:] == ["第一段。", "第二段。"]
    assert corpus_text("oci")[-1] == paragraph_text("lnc", 20, 0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("only one column\n", r"swh.tsv:1: expected 'source<TAB>reference'"),
        ("a\tb\tc\n", "got 3 column"),
        ("\n", "no rows"),
    ],
)
def test_bad_parallel_file(tmp_path, content, message):
    parallel = tmp_path / "swh.tsv"
    parallel.write_text(content)
    languages.register(language_from_files("swh", parallel=parallel))
    with pytest.raises(UserError, match=message):
        build_prompts("swh", "translation")


def test_task_errors(tmp_path):
    with pytest.raises(UserError, match="unknown task 'summary': use translation, story, continuation"):
        build_prompts("oci", "summary")
    with pytest.raises(UserError, match="pick a language other than English"):
        build_prompts("eng", "translation")
    with pytest.raises(UserError, match="limit must be >= 1"):
        build_prompts("oci", "story", limit=0)
    corpus = tmp_path / "c.txt"
    corpus.write_text("text\n")
    only_corpus = Language("xx", "X", "Latn", corpus=corpus)
    assert corpus_text(only_corpus) == ["text"]
    assert build_prompts(only_corpus, "story", limit=1)[0].text.endswith("X:\n")  # no lead: a header
    with pytest.raises(UserError, match="no held-out text"):
        build_prompts(only_corpus, "translation")


def test_missing_udhr_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "empty"))
    with pytest.raises(UserError, match="polyspec assets fetch --only udhr"):
        corpus_text("oci")


def test_copy4_and_distinct2():
    prompt = [1, 2, 3, 4, 5, 6]
    assert copy4([1, 2, 3, 4, 5], prompt) == 1.0
    assert copy4([3, 4, 5, 6, 9, 9], prompt) == pytest.approx(1 / 3)  # 3456 yes, 4569 and 5699 no
    assert copy4([1, 2, 3], prompt) == 0.0  # no 4-gram at all
    assert copy4([7, 8, 9, 10], prompt) == 0.0
    assert distinct2([5, 5, 5, 5]) == pytest.approx(1 / 3)
    assert distinct2([1, 2, 3, 4]) == 1.0
    assert distinct2([1]) == 0.0


def test_cut_at_stop():
    assert tasks.cut_at_stop(" Bonjorn\nEnglish: x", ("\n",)) == " Bonjorn"
    assert tasks.cut_at_stop("a\n\nb\nc", ("\n\n", "\n")) == "a"
    assert tasks.cut_at_stop("abc", ("\n",)) == "abc"
