"""The benchmark runs the distilled drafters by name, and its report carries the
generalisation table: trained on translation, tested on stories."""

from __future__ import annotations

import pytest
from fixtures import corpus_lines

from polyspec.bench.grid import BenchConfig
from polyspec.bench.report import write_report
from polyspec.bench.results import read_records
from polyspec.bench.runner import run_bench
from polyspec.distill.data import DataOptions
from polyspec.distill.init import VocabSource, init_drafter
from polyspec.distill.report import generalisation_section
from polyspec.distill.store import drafter_dir
from polyspec.distill.trainer import TrainConfig, train


def record(language: str, task: str, drafter: str, alpha: float, mode: str = "greedy") -> dict:
    return {"language": language, "task": task, "drafter": drafter, "alpha": alpha, "mode": mode}


def test_the_table_and_its_verdict_follow_the_numbers():
    records = []
    for language, gain, story_gain in [("amh", 0.2, 0.0), ("yor", 0.15, 0.12), ("npi", 0.11, 0.02), ("zh", 0.05, 0.0)]:
        records += [
            record(language, "translation", "draft-baseline", 0.3),
            record(language, "translation", "distill-task", 0.3 + gain),
            record(language, "story", "draft-baseline", 0.2),
            record(language, "story", "distill-task", 0.2 + story_gain),
        ]
    text = "\n".join(generalisation_section(records))
    assert "| yor | 0.30 | 0.45 | +0.15 | 0.20 | 0.32 | +0.12 |" in text
    assert "in 3 study language(s) (amh, npi, yor; goal >= 4): **not met**" in text
    assert "carries over (>= 0.10) in 1 of 3 (yor)" in text
    records += [record("ibo", "translation", "draft-baseline", 0.1), record("ibo", "translation", "distill-task", 0.4)]
    assert "**met**" in "\n".join(generalisation_section(records))
    assert generalisation_section([r for r in records if r["drafter"] != "draft-baseline"]) == []


@pytest.fixture
def language_files(tmp_path, monkeypatch):
    from polyspec.assets import languages

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(languages, "_registered", {})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * 7 + j) % 40 + 5}" for j in range(12)) for i in range(30)))
    parallel = tmp_path / "parallel.tsv"
    rows = [
        " ".join(f"w{k}" for k in range(i, i + 5)) + "\t" + " ".join(f"w{k}" for k in range(i + 9, i + 4, -1))
        for i in range(5, 12)
    ]
    parallel.write_text("\n".join(rows))
    training = tmp_path / "training.tsv"
    training.write_text("\n".join(f"w{i} w{i + 1}\tw{i + 20} w{i + 21} w{i + 22}" for i in range(30, 38)))
    return corpus, parallel, training


def test_the_bench_runs_distilled_drafters_and_reports_how_they_generalise(verifier_dir, language_files, tmp_path):
    corpus, parallel, training = language_files
    from polyspec.assets.languages import language_from_files, register

    register(language_from_files("tst", corpus=corpus, parallel=parallel), replace_existing=True)
    baseline = drafter_dir("tst", "baseline")
    init_drafter(str(verifier_dir), 2, baseline, 48, [VocabSource("test", corpus_lines())])
    options = DataOptions(kind="translation", language="tst", max_new_tokens=8, samples=2, parallel=str(training))
    settings = {
        "steps": 6,
        "batch_size": 4,
        "lr": 3e-3,
        "device": "cpu",
        "teacher_dtype": "float32",
        "mixed_precision": "no",
    }
    train(
        TrainConfig(str(verifier_dir), str(baseline), str(drafter_dir("tst", "task")), options, **settings),
        show_progress=False,
    )
    config = BenchConfig(
        languages=("tst",),
        tasks=("translation", "story"),
        drafters=("none", "draft-baseline", "distill-task"),
        modes=("greedy",),
        limit=1,
        max_new_tokens=10,
        verifier=str(verifier_dir),
        dtype="float32",
        corpora={"tst": corpus},
        parallels={"tst": parallel},
    )
    path = run_bench(config, tmp_path / "out", resume=False, show_progress=False)
    records = read_records(path)
    assert {r["drafter"] for r in records} == {"none", "draft-baseline", "distill-task"}
    assert all(r["identical"] for r in records)  # greedy, float32: the drafters change nothing
    text = write_report([path], tmp_path / "report").read_text()
    assert "## Distilled drafters: trained on translation, tested on stories" in text
    assert "| tst |" in text.split("## Distilled drafters")[1]
