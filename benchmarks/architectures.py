"""Architecture sweep: does `polyspec generate` decode every Hugging Face causal LM losslessly?

For every architecture in transformers' causal-LM mapping (plus a few variants, e.g. hybrids
with no attention layer), build a tiny random model from the architecture's own config class
(tests/tiny_models.py), save it with the tests' word-level tokenizer next to a second tiny model
of the same architecture (the first one's weights with noise: a drafter often but not always
right), then run the real command line in this process,

    polyspec generate --verifier DIR --drafter {prompt-lookup, model:DRAFT_DIR} --gamma 3
        --prompt ... --max-new-tokens 24 --dtype float32 --json

and compare its token ids with transformers' `model.generate(do_sample=False)` (where that fails,
with greedy full forwards and no cache, and the record says so). Each architecture ends as

- identical: both drafters give transformers' tokens;
- refused: polyspec exits with code 2 and one line saying why (no traceback);
- not constructible tiny: the tiny config or model cannot be built or run (the reason is kept);
- mismatch / traceback: a failure of polyspec, listed with the first diverging token or error.

Also recorded: the rollback policy CachedLM picks, the cost of one rollback against a verify
call on the tiny model, and whether the model takes token trees (a tree forward checked against
chain forwards). Writes JSON and a markdown table.

    .venv/bin/python benchmarks/architectures.py \\
        --json docs/results/architectures.json --markdown docs/results/architectures.md
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tiny_models  # noqa: E402
from fixtures import build_tokenizer  # noqa: E402

from polyspec.cached_lm import CachedLM  # noqa: E402
from polyspec.files import write_atomic  # noqa: E402
from polyspec.models import load_tokenizer  # noqa: E402

PROMPT = "w5 w6 w7 w5 w6 w7 w5 w6"  # repeats, so prompt lookup has something to copy
MAX_NEW = 24  # the sequence outgrows the tiny sliding window of 8
ALL_LINEAR = {"layer_types": ["linear_attention"] * 2}
# Variants beyond the mapping's defaults: (name, model type, config overrides).
VARIANTS = [
    ("qwen3_5_text/all-linear", "qwen3_5_text", ALL_LINEAR),
    ("qwen3_next/2-layer", "qwen3_next", {"layer_types": None, "num_hidden_layers": 2}),
    ("granitemoehybrid/all-linear", "granitemoehybrid", ALL_LINEAR),
    ("lfm2/all-conv", "lfm2", {"layer_types": ["conv"] * 2}),
]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def reference(model, ids: list[int]) -> tuple[list[int], str]:
    """transformers' greedy tokens, or greedy full forwards where `generate` fails."""
    try:
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
        return out[0, len(ids) :].tolist(), "generate"
    except Exception as exc:  # noqa: BLE001 - recorded, then the reference is computed without generate
        note = f"full forwards (generate: {first_line(exc)})"
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    sequence = list(ids)
    with torch.inference_mode():
        for _ in range(MAX_NEW):
            token = int(model(torch.tensor([sequence]), use_cache=False).logits[0, -1].argmax())
            sequence.append(token)
            if token in eos:
                break
    return sequence[len(ids) :], note


def run_cli(args: list[str]) -> tuple[int, str, str, str | None]:
    """The entry point in this process: (exit code, stdout, stderr, traceback or None)."""
    from polyspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["polyspec", *args]
    code, trace = 0, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a traceback is a finding
        code, trace = 1, traceback.format_exc()
    finally:
        sys.argv = saved
    return code, out.getvalue(), err.getvalue(), trace


def rollback_cost(model, ids: list[int], repeats: int = 5) -> dict:
    """Median forward of 4 tokens and rollback keeping 2 of them, after the prompt. Each rollback is
    checked: the next forward's logits must equal those of another CachedLM of the same model fed
    the kept tokens in the same chunks without any rollback (the same rounding)."""
    lm = CachedLM(model)
    lm.reset()
    chunks = [list(ids[:-1])]
    lm.forward(chunks[0], num_logits=1)
    forward_s, rollback_s, worst = [], [], 0.0
    for i in range(repeats + 1):
        tokens = [ids[-1] if i == 0 else chunks[-1][-1] % 50 + 4, 7 + i, 8 + i, 9 + i]
        began = time.perf_counter()
        lm.forward(tokens)
        middle = time.perf_counter()
        lm.rollback(lm.length - 2)
        end = time.perf_counter()
        chunks.append(tokens[:2])
        if i:
            forward_s.append(middle - began)
            rollback_s.append(end - middle)
        fresh = CachedLM(model)
        fresh.reset()
        for chunk in chunks:
            fresh.forward(chunk, num_logits=1)
        probe = [11 + i, 12 + i]
        expected = fresh.forward(probe)
        after = lm.forward(probe)  # after the other one's forwards on the same model
        lm.rollback(lm.length - len(probe))
        scale = expected.abs().max().clamp(min=1e-6)
        worst = max(worst, float((after - expected).abs().max() / scale))
    forward, rollback = statistics.median(forward_s), statistics.median(rollback_s)
    return {
        "policy": lm.policy.name,
        "stepwise": lm.call.stepwise,
        "verify_ms": 1e3 * forward,
        "rollback_ms": 1e3 * rollback,
        "rollback_share": rollback / forward,
        "exact": worst <= 1e-5,
        "max_relative_error": worst,
    }


def tree_check(model, ids: list[int]) -> str:
    """'yes' when a tree forward gives each node its chain's logits; else why not."""
    lm = CachedLM(model)
    reason = lm.tree_support()
    if reason is not None:
        return f"no: {reason}"
    parents = [-1, 0, 0, 1, 2]
    tokens = [ids[-1], 9, 10, 11, 12]
    try:
        lm.reset()
        lm.forward(ids[:-1])
        logits = lm.forward(tokens, parents=parents)
        chains = [[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4]]
        with torch.inference_mode():
            for node, chain in enumerate(chains):
                full = model(torch.tensor([ids[:-1] + [tokens[i] for i in chain]])).logits[0, -1]
                if not torch.allclose(full, logits[node], atol=1e-4, rtol=1e-4):
                    return f"mismatch at node {node} (max diff {float((full - logits[node]).abs().max()):.2e})"
        lm.keep([0, 2, 4])
    except Exception as exc:  # noqa: BLE001
        return f"error: {first_line(exc)}"
    return "yes"


def sweep_one(name: str, model_type: str, overrides: dict | None, tokenizer, workdir: Path) -> dict:
    record: dict = {"architecture": name, "model_type": model_type}
    began = time.perf_counter()
    try:
        model_class = tiny_models.model_class(model_type).__name__
        record["class"] = model_class
        verifier = tiny_models.tiny_model(model_type, seed=0, overrides=overrides)
        draft = tiny_models.tiny_model(model_type, seed=1, base=verifier)
        verifier_dir, draft_dir = workdir / f"{name.replace('/', '_')}-v", workdir / f"{name.replace('/', '_')}-d"
        for model, path in ((verifier, verifier_dir), (draft, draft_dir)):
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
        # the prompt's ids as the command line will see them (AutoTokenizer may pick a class of
        # the model's own family for the saved tokenizer)
        ids = load_tokenizer(str(verifier_dir))(PROMPT)["input_ids"]
        if ids != tokenizer(PROMPT)["input_ids"]:
            record["tokenizer"] = f"reloaded as {type(load_tokenizer(str(verifier_dir))).__name__}: prompt ids {ids}"
        expected, record["reference"] = reference(verifier, ids)
    except Exception as exc:  # noqa: BLE001
        record.update(status="not constructible tiny", reason=first_line(exc))
        record["seconds"] = time.perf_counter() - began
        return record
    record["parameters"] = sum(p.numel() for p in verifier.parameters())
    record["drafters"] = {}
    outcomes = []
    for drafter in ("prompt-lookup", f"model:{draft_dir}"):
        args = ["generate", "--verifier", str(verifier_dir), "--drafter", drafter, "--gamma", "3"]
        args += ["--prompt", PROMPT, "--max-new-tokens", str(MAX_NEW), "--dtype", "float32", "--json"]
        code, out, err, trace = run_cli(args)
        label = drafter.split(":")[0]
        lines = [line for line in err.strip().splitlines() if line.strip()]
        if trace is not None:
            outcome = {"status": "traceback", "reason": trace.strip().splitlines()[-1][:300]}
        elif code == 2 and len(lines) == 1 and lines[0].startswith("polyspec: error:"):
            outcome = {"status": "refused", "reason": lines[0].removeprefix("polyspec: error: ")}
        elif code != 0:
            outcome = {"status": "traceback", "reason": f"exit {code}: {(lines or [''])[-1][:300]}"}
        else:
            result = json.loads(out)
            tokens = result["token_ids"]
            stats = result["stats"]
            if tokens == expected:
                outcome = {"status": "identical", "accepted": stats.get("accepted"), "drafted": stats.get("drafted")}
            else:
                diverge = next((i for i, (a, b) in enumerate(zip(tokens, expected, strict=False)) if a != b), None)
                diverge = min(len(tokens), len(expected)) if diverge is None else diverge
                outcome = {"status": "mismatch", "reason": f"first diverging token {diverge}"}
        record["drafters"][label] = outcome
        outcomes.append(outcome["status"])
    if all(status == "identical" for status in outcomes):
        record["status"] = "identical"
    elif all(status == "refused" for status in outcomes):
        record["status"] = "refused"
        record["reason"] = record["drafters"]["prompt-lookup"]["reason"]
    else:
        record["status"] = next(s for s in ("traceback", "mismatch", "refused") if s in outcomes)
        record["reason"] = "; ".join(f"{k}: {v.get('reason', v['status'])}" for k, v in record["drafters"].items())
    if record["status"] == "identical":
        try:
            record["rollback"] = rollback_cost(verifier, tokenizer(PROMPT)["input_ids"])
        except Exception as exc:  # noqa: BLE001
            record["rollback"] = {"error": first_line(exc)}
        record["trees"] = tree_check(verifier, tokenizer(PROMPT)["input_ids"])
    record["seconds"] = time.perf_counter() - began
    return json.loads(json.dumps(record).replace(str(workdir), "WORKDIR"))  # no machine paths in the record


def markdown(records: list[dict], summary: dict) -> str:
    lines = [
        "| architecture | class | status | rollback | rollback / verify call | trees | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        rollback = r.get("rollback", {})
        policy = rollback.get("policy", "")
        cost = (
            f"{rollback['rollback_ms']:.2f} / {rollback['verify_ms']:.2f} ms ({100 * rollback['rollback_share']:.0f}%)"
            if "rollback_ms" in rollback
            else ""
        )
        trees = r.get("trees", "")
        note = r.get("reason", "")
        if r.get("reference", "generate") != "generate":
            note = f"reference: {r['reference']}"
        note = note.replace("|", "\\|")
        trees = trees.replace("|", "\\|")
        lines.append(
            f"| {r['architecture']} | {r.get('class', '')} | {r['status']} | {policy} | {cost} | {trees} | {note} |"
        )
    counts = ", ".join(f"{k}: {v}" for k, v in summary["counts"].items())
    return "\n".join([f"{counts}; {summary['seconds']:.0f} s in all.", "", *lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="architectures to run (default: all)")
    parser.add_argument("--json", dest="json_path", default=None, help="write the records here")
    parser.add_argument("--markdown", default=None, help="write the table here")
    args = parser.parse_args()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.utils import logging

    warnings.filterwarnings("ignore")
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    entries = [(name, name, None) for name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES] + VARIANTS
    if args.only:
        entries = [entry for entry in entries if entry[0] in args.only]
    tokenizer = build_tokenizer()
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model_type, overrides in entries:
            record = sweep_one(name, model_type, overrides, tokenizer, Path(tmp))
            records.append(record)
            print(json.dumps({k: record.get(k) for k in ("architecture", "status", "reason", "seconds")}), flush=True)
            for path in Path(tmp).iterdir():  # keep the disk use of one architecture at a time
                for child in sorted(path.rglob("*"), reverse=True):
                    child.unlink() if child.is_file() else child.rmdir()
                path.rmdir()
    counts: dict[str, int] = {}
    for record in records:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    summary = {
        "counts": counts,
        "seconds": time.perf_counter() - began,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "torch": torch.__version__,
    }
    import transformers

    summary["transformers"] = transformers.__version__
    print(json.dumps(summary))
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.json_path, json.dumps({"summary": summary, "records": records}, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown(records, summary))


if __name__ == "__main__":
    main()
