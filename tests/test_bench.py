"""The benchmark harness on a tiny model and a user-supplied language: records, resume, shards,
report files, provenance, the adaptive and distilled n-gram drafters, and one-line errors."""

from __future__ import annotations

import copy
import hashlib
import json
import os

import pytest
from fixtures import run_cli

from polyspec.bench.grid import ROUTERS, BenchConfig, record_key
from polyspec.bench.report import distilled_goals, write_report
from polyspec.bench.results import read_records
from polyspec.bench.runner import (
    DISTILL_CORPUS_WEIGHT,
    TREE_BUDGET,
    TREE_DEPTH,
    BenchRunner,
    plan_units,
    resolve_grid_languages,
    run_bench,
)
from polyspec.drafters.adaptive import DRAWN_POLICIES, AdaptiveDrafter
from polyspec.drafters.base import can_branch

FIELDS = {
    "version", "commit", "seed", "dtype", "device", "language", "task", "drafter", "gamma", "mode", "alpha",
    "tau", "c", "f_measured", "f_predicted", "chrf", "distinct2", "copy4", "identical", "new_tokens",
    "plain_seconds", "spec_seconds",
}  # fmt: skip
NEW_FIELDS = {
    "tree", "max_depth", "nodes_verified", "nodes_per_call", "accepted_per_call", "drafter_source", "verify_costs",
    "output_sha256",
}  # fmt: skip


def sha256(path) -> str:
    """Of a file's bytes; records show files in the polyspec home as $POLYSPEC_HOME/..."""
    return hashlib.sha256(open(os.path.expandvars(str(path)), "rb").read()).hexdigest()


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
        drafters=("none", "ngram-bigram", "ngram+context", "prompt-lookup", "hf-prompt-lookup", "adaptive"),
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
    assert len(records) == units * (1 + 5 * 2)  # none once, the others per gamma
    branches = can_branch(AdaptiveDrafter({}, None))  # trees once the router can branch
    for r in records:
        assert set(r) >= FIELDS | NEW_FIELDS, (FIELDS | NEW_FIELDS) - set(r)
        assert r["new_tokens"] == 12 and r["plain_seconds"] > 0 and r["spec_seconds"] > 0
        if r["mode"] == "greedy":
            assert r["identical"], r  # float32: speculation changes nothing
            plain = next(p for p in records if p["drafter"] == "none" and record_key(p)[:4] == record_key(r)[:4])
            assert r["output_sha256"] == plain["output_sha256"]
        if r["drafter"] not in ("none", "hf-prompt-lookup"):
            assert 0 <= r["alpha"] <= 1 and r["f_predicted"] > 0
        # Tree statistics: positions fed per call are the pending token and the draft nodes.
        trees = r["drafter"] == "adaptive" and branches
        assert r["tree"] == (max(TREE_BUDGET, TREE_DEPTH, r["gamma"]) if trees else 0)
        assert r["max_depth"] == (max(TREE_DEPTH, r["gamma"]) if trees else r["gamma"])
        assert r["nodes_verified"] >= r["verifier_calls"] and r["nodes_per_call"] >= 1
        if r["drafter"] == "none":
            assert r["nodes_per_call"] == 1 and r["accepted_per_call"] == 0
        elif r["drafter"] != "hf-prompt-lookup":
            # Counts, not the per-call ratios: 1/11 <= 12/11 - 1 fails in floating point.
            assert r["nodes_verified"] <= r["verifier_calls"] * (1 + (r["tree"] or r["gamma"]))
            assert r["accepted_per_call"] == r["accepted"] / r["verifier_calls"]
            assert r["accepted"] <= r["nodes_verified"] - r["verifier_calls"]
        assert (r["verify_costs"] is not None) == (r["drafter"] == "adaptive")
    assert any(r["alpha"] for r in records if r["drafter"] == "prompt-lookup")
    curve = next(r["verify_costs"] for r in records if r["drafter"] == "adaptive")
    assert curve["widths"][0] == 1 and len(curve["seconds"]) == len(curve["widths"])
    # A part's own chains, when it branches, are routed as "PART chain".
    # The bandit's fixed trees of draws are routed as "PART chain, POLICY".
    pieces = [piece.split(", ") for r in records for key in r.get("route", {}) for piece in key.split(" | ")]
    routes = {piece[0].removesuffix(" chain") for piece in pieces}
    assert routes and routes <= {"plain", "ngram", "ngram+context", "prompt-lookup"}, routes
    assert {policy for piece in pieces for policy in piece[1:]} <= set(DRAWN_POLICIES)


def test_every_record_names_the_model_file_and_text_it_comes_from(verifier_dir, verifier, language_files, tmp_path):
    corpus, parallel = language_files
    config = config_for(verifier_dir, language_files, modes=("greedy",), gammas=(3,), tasks=("continuation",), limit=1)
    records = read_records(run_bench(config, tmp_path / "out", resume=False, show_progress=False))
    by_drafter = {r["drafter"]: r["drafter_source"] for r in records}
    assert by_drafter["none"] is None and by_drafter["prompt-lookup"] is None and by_drafter["hf-prompt-lookup"] is None
    for name in ("ngram-bigram", "ngram+context"):
        source = by_drafter[name]
        assert source["model_file"].startswith("$POLYSPEC_HOME/ngram/")  # alike on every machine
        assert source["sha256"] == sha256(source["model_file"])
        files = {entry["file"]: entry["sha256"] for entry in source["trained_on"]["corpus"]}
        assert files == {str(corpus): sha256(corpus), str(parallel): sha256(parallel)}
        assert len(source["trained_on"]["text_sha256"]) == 64
    parts = by_drafter["adaptive"]["parts"]
    assert parts["ngram+context"] == by_drafter["ngram+context"] and parts["prompt-lookup"] is None
    assert parts["ngram"] == parts["ngram+context"]  # one order-4 file, drafted with and without the context
    # Another corpus: another model file, another source.
    corpus.write_text(corpus.read_text() + "\nw5 w6 w7 w8 w9")
    runner = BenchRunner(config, verifier, tmp_path / "home" / "ngram")
    other = runner.source("ngram-bigram", resolve_grid_languages(config)[0])
    assert other["sha256"] != by_drafter["ngram-bigram"]["sha256"]
    before = by_drafter["ngram-bigram"]["trained_on"]["corpus"][0]["sha256"]
    assert other["trained_on"]["corpus"][0]["sha256"] == sha256(corpus) != before


def test_ngram_stats_shows_the_benchs_provenance(verifier, language_files, tmp_path):
    config = config_for(str(verifier.name), language_files)
    runner = BenchRunner(config, verifier, tmp_path / "ngram")
    language = resolve_grid_languages(config)[0]
    path = runner.ngram_path("ngram-bigram", language)
    code, out, _ = run_cli("ngram", "stats", str(path), "--json")
    assert code == 0 and json.loads(out)["source"] == runner.source("ngram-bigram", language)
    code, out, _ = run_cli("ngram", "stats", str(path))
    assert code == 0 and f"file sha256 {sha256(path)}" in out and "corpus.txt" in out, out


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


def test_distilled_ngrams_are_sampled_once_per_verifier_and_settings(verifier, language_files, tmp_path):
    from polyspec.drafters.ngram import NGramDrafter
    from polyspec.models import LoadedModel
    from polyspec.ngram.query import ROOT
    from polyspec.ngram_distill import SAMPLE_UNIT

    config = config_for(str(verifier.name), language_files, distill_tokens=40)
    runner = BenchRunner(config, verifier, tmp_path / "ngram")
    language = resolve_grid_languages(config)[0]
    plain, context = runner.drafter("ngram-distill", language), runner.drafter("ngram-distill+context", language)
    assert isinstance(plain, NGramDrafter) and not plain.options.use_context and context.options.use_context
    path = runner.ngram_path("ngram-distill", language)
    assert plain.model.order == config.ngram_order and path.name.startswith("tst-distill-o4-")
    log = runner.distilled.samples_dir(language) / "samples.jsonl"
    assert log.parent.parent == path.parent and log.parent.name.startswith("tst-distill-")
    assert sum(len(json.loads(line)["ids"]) for line in log.read_text().splitlines()) >= 40
    source = runner.source("ngram-distill", language)
    assert source["sha256"] == sha256(path) and source == runner.source("ngram-distill+context", language)
    distillation = source["trained_on"]["distillation"]
    assert distillation["settings"]["tokens"] == 40 and distillation["language"] == "tst"
    # The corpus split is mixed in, weighing DISTILL_CORPUS_WEIGHT times: its files are recorded,
    # and its n-grams are counted that many times over the samples'.
    assert distillation["mix_corpus_weight"] == str(DISTILL_CORPUS_WEIGHT)
    assert [entry["file"] for entry in distillation["corpus"]] == [str(path) for path in language_files]
    assert distillation["corpus"][1]["held_out"]  # the parallel file: what the split leaves out
    mixed_ids, mixed_counts = plain.model.continuations(*ROOT)  # unigram counts
    corpus_ids, corpus_counts = runner.drafter("ngram", language).model.continuations(*ROOT)
    weighed = dict(zip(mixed_ids.tolist(), mixed_counts.tolist(), strict=True))
    corpus = zip(corpus_ids.tolist(), corpus_counts.tolist(), strict=True)
    assert all(weighed[t] >= DISTILL_CORPUS_WEIGHT * SAMPLE_UNIT * c for t, c in corpus)
    assert sum(mixed_counts.tolist()) > DISTILL_CORPUS_WEIGHT * SAMPLE_UNIT * sum(corpus_counts.tolist())
    # The router over the distilled n-grams: its own part instances, each part's provenance.
    router = runner.drafter("adaptive-distill", language)
    arms = {arm.name: arm.drafter for arm in router.arms if arm.of is None}
    assert isinstance(router, AdaptiveDrafter) and list(arms) == list(ROUTERS["adaptive-distill"])
    assert arms["ngram-distill"] is not plain and arms["ngram-distill"].model.order == 4
    assert runner.source("adaptive-distill", language)["parts"]["ngram-distill+context"] == source
    # Cached: a second runner samples nothing; other settings or another verifier, another model.
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ngram").iterdir()}
    logged = log.stat().st_mtime_ns
    again = BenchRunner(config, verifier, tmp_path / "ngram")
    assert again.ngram_path("ngram-distill", language) == path
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ngram").iterdir()} == before
    # Another corpus: another model from the same samples (nothing sampled again).
    language_files[0].write_text(language_files[0].read_text() + "\nw5 w6 w7 w8")
    mixed = BenchRunner(config, verifier, tmp_path / "ngram")
    assert mixed.ngram_path("ngram-distill", resolve_grid_languages(config)[0]) != path
    assert log.stat().st_mtime_ns == logged
    more = BenchRunner(BenchConfig(**{**config.__dict__, "distill_tokens": 41}), verifier, tmp_path / "ngram")
    assert more.distilled.key(language, 4) != runner.distilled.key(language, 4)
    changed = copy.deepcopy(verifier.model)
    next(changed.parameters()).data[0, 0] += 1.0
    other = BenchRunner(config, LoadedModel(model=changed, tokenizer=verifier.tokenizer, name=verifier.name), tmp_path)
    assert other.distilled.key(language, 4) != runner.distilled.key(language, 4)


def without(record: dict, *keys) -> dict:
    return {k: v for k, v in record.items() if k not in keys}


def test_report_sets_adaptive_against_its_rivals_and_keeps_sources_apart(verifier_dir, language_files, tmp_path):
    corpus, _ = language_files
    config = config_for(verifier_dir, language_files, modes=("greedy",), gammas=(3,), limit=1)
    first = run_bench(config, tmp_path / "a", resume=False, show_progress=False)
    report = write_report([first], tmp_path / "report")
    text = report.read_text()
    assert "- translation, greedy: `adaptive` (tree " in text and "best fixed chain `" in text, text
    assert "hf-prompt-lookup" in text.split("- continuation, greedy: `adaptive`")[1].splitlines()[0]
    assert "## Trees and verify width" in text and "## Verify cost by width" in text
    assert (tmp_path / "report" / "verify_costs.png").stat().st_size > 0
    # Old records (no trees, no provenance, no cost curves) still load.
    old = tmp_path / "old" / "results.jsonl"
    old.parent.mkdir()
    new_keys = (*NEW_FIELDS, "route")
    old.write_text("".join(json.dumps(without(r, *new_keys)) + "\n" for r in read_records(first)))
    assert "## translation, greedy" in write_report([old], tmp_path / "old-report").read_text()
    # A run on another corpus: its n-gram drafters are reported apart, prompt lookup pooled.
    corpus.write_text(corpus.read_text() + "\nw5 w6 w7 w8 w9")
    second = run_bench(config, tmp_path / "b", resume=False, show_progress=False)
    text = write_report([first, second], tmp_path / "both").read_text()
    assert "| ngram-bigram [a] |" in text and "| ngram-bigram [b] |" in text and "| adaptive [b] |" in text
    assert "| prompt-lookup |" in text and "prompt-lookup [" not in text
    rows = (tmp_path / "both" / "results.csv").read_text().splitlines()
    apart = [r for r in read_records(second) if r["drafter_source"] is not None]  # the rest: same keys, replaced
    assert len(rows) == 1 + len(read_records(first)) + len(apart)
    # Old and new records of one n-gram: unrecorded differs from a recorded source.
    assert "| ngram-bigram [old] |" in write_report([old, second], tmp_path / "mixed").read_text()
    # Different sources in one file: refused.
    mixed = tmp_path / "mixed-run" / "results.jsonl"
    mixed.parent.mkdir()
    mixed.write_text(first.read_text() + "".join(
        json.dumps({**r, "seed": 7}) + "\n" for r in read_records(second) if r["drafter"] == "ngram-bigram"
    ))  # fmt: skip
    with pytest.raises(Exception, match="different model files"):
        write_report([mixed], tmp_path / "refused")


def test_report_sets_distilled_ngrams_against_the_corpus_ones():
    def record(drafter, mode, task, accepted, drafted, f):
        return dict(drafter=drafter, mode=mode, task=task, accepted=accepted, drafted=drafted, f_measured=f)

    records = [
        record("ngram", "sample", "story", 2, 20, 1.0),
        record("ngram", "sample", "continuation", 8, 180, 1.0),
        record("ngram-distill", "sample", "story", 24, 100, 1.4),
        record("ngram-distill", "sample", "continuation", 8, 100, 1.3),
        record("ngram", "greedy", "translation", 30, 100, 1.5),
        record("ngram-distill", "greedy", "translation", 29, 100, 1.6),
        record("ngram", "greedy", "story", 1, 10, 1.1),
        record("ngram-distill", "greedy", "story", 5, 10, 1.3),
    ]
    sampled, greedy = distilled_goals(records)
    # Pooled over records (32 of 200 against 10 of 200), not a mean of the records' ratios (4.2).
    assert sampled == (
        "- Sampled story + continuation: `ngram-distill` acceptance 0.160 vs `ngram` 0.050, ratio 3.20 (goal >= 3), "
        "f = 1.35x (goal >= 1.3): **met**"
    )
    assert greedy.endswith("translation 0.290 vs 0.300, story 0.500 vs 0.100 (goal: no lower on any task): **not met**")
    records[2]["f_measured"] = 1.1
    assert distilled_goals(records)[0].endswith("f = 1.20x (goal >= 1.3): **not met**")
    assert distilled_goals([r for r in records if r["drafter"] != "ngram"]) == []


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
        ["--distill-tokens", "0"],
    ],
)
def test_bench_bad_input_is_one_line(monkeypatch, tmp_path, args):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    code, out, err = run_cli("bench", "--out", str(tmp_path / "o"), *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("polyspec: error:"), err


def test_language_without_corpus_text_is_a_user_error(monkeypatch, tmp_path, verifier_dir):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    parallel = tmp_path / "p.tsv"
    parallel.write_text("w5 w6 w7 w8 w9 w10 w11\tw9 w8 w7 w6 w5 w4 w12\n")
    code, _, err = run_cli("bench", "--languages", "tst", "--corpus", f"tst={empty}", "--parallel",
        f"tst={parallel}", "--verifier", str(verifier_dir), "--dtype", "float32", "--out", str(tmp_path / "o"),
        "--drafters", "ngram", "--tasks", "continuation",
    )  # fmt: skip
    assert code == 2 and "corpus" in err and len(err.strip().splitlines()) == 1, err


def test_a_verifier_given_by_path_is_recorded_relative_to_the_polyspec_home(tmp_path, monkeypatch):
    from polyspec.bench.provenance import trained_on

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path))
    inside = trained_on({"distilled_from": str(tmp_path / "verifier" / "v"), "settings": '{"tokens": 5}'})
    assert inside["distillation"] == {"distilled_from": "$POLYSPEC_HOME/verifier/v", "settings": {"tokens": 5}}
    assert trained_on({"distilled_from": "org/model"})["distillation"]["distilled_from"] == "org/model"
