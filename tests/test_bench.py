"""The benchmark harness on a tiny model and a user-supplied language: records, resume, shards,
report files, and one-line errors."""

from __future__ import annotations

import json

import pytest
from fixtures import run_cli

from polyspec.bench.grid import BenchConfig, record_key
from polyspec.bench.report import write_report
from polyspec.bench.results import read_records
from polyspec.bench.runner import BenchRunner, plan_units, resolve_grid_languages, run_bench

FIELDS = {
    "version", "commit", "seed", "dtype", "device", "language", "task", "drafter", "gamma", "mode", "alpha",
    "tau", "c", "f_measured", "f_predicted", "chrf", "distinct2", "copy4", "identical", "new_tokens",
    "plain_seconds", "spec_seconds",
}  # fmt: skip


@pytest.fixture()
def language_files(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * 7 + j) % 40 + 5}" for j in range(12)) for i in range(30)))
    parallel = tmp_path / "parallel.tsv"
    source = "w{} w{} w{} w{} w{} w{} w{}"
    rows = [source.format(*range(i, i + 7)) + "\t" + source.format(*range(i + 9, i + 2, -1)) for i in range(5, 12)]
    parallel.write_text("\n".join(rows))
    return corpus, parallel


def config_for(verifier_dir, language_files, **overrides) -> BenchConfig:
    corpus, parallel = language_files
    settings = dict(
        languages=("tst",),
        tasks=("translation", "continuation"),
        drafters=("none", "ngram-bigram", "ngram+context", "prompt-lookup", "hf-prompt-lookup"),
        gammas=(2, 3),
        modes=("greedy", "sample"),
        limit=2,
        max_new_tokens=12,
        verifier=str(verifier_dir),
        dtype="float32",
        corpora={"tst": corpus},
        parallels={"tst": parallel},
    )
    return BenchConfig(**(settings | overrides))


def test_records_have_every_field_and_greedy_runs_are_identical(verifier_dir, language_files, tmp_path):
    config = config_for(verifier_dir, language_files)
    path = run_bench(config, tmp_path / "out", resume=False, show_progress=False)
    records = read_records(path)
    units = len(plan_units(config, resolve_grid_languages(config)))
    assert units == 2 * 2 * 2  # tasks x prompts x modes
    assert len(records) == units * (1 + 4 * 2)  # none once, the others per gamma
    for r in records:
        assert set(r) >= FIELDS, FIELDS - set(r)
        assert r["new_tokens"] == 12 and r["plain_seconds"] > 0 and r["spec_seconds"] > 0
        if r["mode"] == "greedy":
            assert r["identical"], r  # float32: speculation changes nothing
        if r["drafter"] not in ("none", "hf-prompt-lookup"):
            assert 0 <= r["alpha"] <= 1 and r["f_predicted"] > 0
    assert any(r["alpha"] for r in records if r["drafter"] == "prompt-lookup")


def test_resume_continues_an_interrupted_run(verifier_dir, language_files, tmp_path):
    config = config_for(verifier_dir, language_files, modes=("greedy",), tasks=("continuation",))
    out = tmp_path / "out"
    path = run_bench(config, out, resume=False, show_progress=False)
    complete = read_records(path)
    lines = path.read_text().splitlines()
    # An interruption: the last records never made it, and one was cut mid-line.
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:25])
    with pytest.raises(Exception, match="--resume"):
        run_bench(config, out, resume=False, show_progress=False)
    run_bench(config, out, resume=True, show_progress=False)
    resumed = read_records(path)
    assert sorted(map(record_key, resumed)) == sorted(map(record_key, complete))
    assert all(json.loads(line) for line in path.read_text().splitlines())
    before = path.read_text()
    run_bench(config, out, resume=True, show_progress=False)  # nothing left to do
    assert path.read_text() == before


def test_shards_partition_the_grid(verifier_dir, language_files):
    config = config_for(verifier_dir, language_files)
    languages = resolve_grid_languages(config)
    whole = [(u.prompt.item, u.prompt.task, u.mode) for u, _ in plan_units(config, languages)]
    parts = []
    for index in (1, 2, 3):
        shard = BenchConfig(**{**config.__dict__, "shard": (index, 3)})
        parts += [(u.prompt.item, u.prompt.task, u.mode) for u, _ in plan_units(shard, languages)]
    assert sorted(parts) == sorted(whole) and len(parts) == len(set(parts))


def test_report_writes_tables_csv_and_plots(verifier_dir, language_files, tmp_path):
    config = config_for(verifier_dir, language_files, modes=("greedy",), gammas=(3,))
    first = run_bench(config, tmp_path / "a", resume=False, show_progress=False)
    second = run_bench(BenchConfig(**{**config.__dict__, "seed": 1}), tmp_path / "b", resume=False, show_progress=False)
    report = write_report([first, second], tmp_path / "report")
    text = report.read_text()
    assert "## translation, greedy" in text and "mean ± 95% CI" in text and "| tst |" in text
    for name in ("alpha_by_language.png", "f_by_language.png", "chrf_vs_alpha.png", "results.csv"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    rows = (tmp_path / "report" / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + len(read_records(first)) + len(read_records(second))


def test_ngram_drafters_are_trained_once_and_built_with_their_options(verifier, language_files, tmp_path):
    from polyspec.drafters.ngram import NGramDrafter

    config = config_for(str(verifier.name), language_files)
    runner = BenchRunner(config, verifier, tmp_path / "ngram")
    language = resolve_grid_languages(config)[0]
    bigram, context = runner.drafter("ngram-bigram", language), runner.drafter("ngram+context", language)
    assert isinstance(bigram, NGramDrafter) and bigram.model.order == 2 and not bigram.options.backoff
    assert context.model.order == config.ngram_order and context.options.use_context and context.options.backoff
    files = sorted((tmp_path / "ngram").iterdir())
    assert [f.suffix for f in files] == [".ngram", ".ngram"]  # no corpus file left behind
    again = BenchRunner(config, verifier, tmp_path / "ngram")
    assert again.ngrams.path(language, 2) in files and sorted((tmp_path / "ngram").iterdir()) == files
    user = runner.drafter(f"ngram:{again.ngrams.path(language, 2)}?min_prob=0.5", language)  # a spec, as typed
    assert user.options.min_prob == 0.5 and user.model.order == 2


@pytest.mark.parametrize(
    "args",
    [
        ["--languages", "xx-unknown"],
        ["--languages", "tst", "--parallel", "tst=/nonexistent.tsv"],
        ["--preset", "huge"],
        ["--shard", "3/2"],
        ["--gammas", "0"],
        ["--modes", "beam"],
        ["--tasks", "poetry"],
        ["--recipe", "nope"],
        ["--dry-run"],
        ["--drafters", "bogus"],
        ["--drafters", "ngram:m.ngram?backoff=maybe"],
    ],
)
def test_bench_bad_input_is_one_line(monkeypatch, capsys, tmp_path, args):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    code, out, err = run_cli(monkeypatch, capsys, "bench", "--out", str(tmp_path / "o"), *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("polyspec: error:"), err


def test_language_without_corpus_text_is_a_user_error(monkeypatch, capsys, tmp_path, verifier_dir):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    parallel = tmp_path / "p.tsv"
    parallel.write_text("w5 w6 w7 w8 w9 w10 w11\tw9 w8 w7 w6 w5 w4 w12\n")
    code, _, err = run_cli(
        monkeypatch, capsys, "bench", "--languages", "tst", "--corpus", f"tst={empty}", "--parallel",
        f"tst={parallel}", "--verifier", str(verifier_dir), "--dtype", "float32", "--out", str(tmp_path / "o"),
        "--drafters", "ngram", "--tasks", "continuation",
    )  # fmt: skip
    assert code == 2 and "corpus" in err and len(err.strip().splitlines()) == 1, err
