"""The engine and `polyspec ngram distill` on a CUDA device (runs on the CPU too, for a dry run).

1. Greedy identity. Tiny Gemma 3 (8-token sliding window) and Llama verifiers saved as model
   directories; `polyspec generate --device DEVICE` with chains, trees and adaptive trees over
   prompt lookup, an n-gram (+context) and a model drafter, against transformers' `generate()`
   on the same device.
2. Exact sampling. Sampled 3-token sequences (chains and 8-node trees, point-mass and stochastic
   drafts) on the device against their exact joint distribution (chi-square p-value).
3. Distillation. `polyspec ngram distill --device DEVICE` with a verifier of the embedded
   Gemma-3-270M's configuration and tokenizer (`--verifier-config DIR`: its config.json and
   tokenizer files) and random weights: sampling time does not depend on the weights' values, and
   only the configuration needs to travel. Timed at the default batch and at `--batch-large`.

    python benchmarks/cuda_check.py --device cuda --verifier-config CONFIG_DIR --out cuda.json
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixtures import (  # noqa: E402
    build_tokenizer,
    check_sampling_is_exact,
    greedy_text_ngram,
    hf_greedy,
    run_cli,
    save,
    tiny_gemma,
    tiny_llama,
)

from polyspec.files import write_atomic  # noqa: E402
from polyspec.models import LoadedModel  # noqa: E402
from polyspec.specs import make_drafter  # noqa: E402

TOKENIZER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def greedy_identity(device: str, root: Path) -> list[dict]:
    tokenizer = build_tokenizer()
    draft_dir = save(tiny_gemma(seed=2, layers=2), tokenizer, root / "draft")
    rows = []
    for family in ("gemma", "llama"):
        model = tiny_gemma(seed=11) if family == "gemma" else tiny_llama(seed=11)
        path = save(model, tokenizer, root / family)
        model = model.to(device)
        ngram = greedy_text_ngram(
            LoadedModel.load(str(path), dtype="float32", device=device), tokenizer, root / f"{family}-ng"
        )
        specs = [
            "none",
            "prompt-lookup",
            f"ngram:{ngram}+context",
            f"ngram:{ngram}",
            f"model:{draft_dir}",
            f"adaptive:prompt-lookup;ngram:{ngram}+context;model:{draft_dir}",
        ]
        for prompt in ("w5 w6 w7 w5 w6 w7 w9 w5 w6", "w12 w40 w3 w12 w40", "w7"):
            expected = hf_greedy(model, tokenizer(prompt)["input_ids"], 40)
            for spec, (gamma, budget) in itertools.product(specs, [(3, 0), (3, 8), (4, 16)]):
                if spec == "none" and budget:
                    continue
                code, out, _ = run_cli(
                    "generate", "--verifier", str(path), "--drafter", spec, "--gamma", str(gamma),
                    "--tree", str(budget), "--prompt", prompt, "--max-new-tokens", "40", "--dtype", "float32",
                    "--device", device, "--json",
                )  # fmt: skip
                result = json.loads(out) if code == 0 else {}
                stats = result.get("stats", {})
                rows.append(
                    {
                        "family": family,
                        "drafter": spec.split(":")[0],
                        "gamma": gamma,
                        "tree": budget,
                        "prompt": prompt,
                        "exit": code,
                        "identical": result.get("token_ids") == expected,
                        "accepted": stats.get("accepted"),
                        "verifier_calls": stats.get("verifier_calls"),
                    }
                )
    return rows


def exact_sampling(device: str, root: Path) -> list[dict]:
    tokenizer = build_tokenizer()
    verifier = LoadedModel.load(str(save(tiny_gemma(seed=1), tokenizer, root / "sampled")), "float32", device)
    save(tiny_gemma(seed=2, layers=2), tokenizer, root / "sdraft")
    ngram = greedy_text_ngram(verifier, tokenizer, root / "sampled-ng")
    cases = [("prompt-lookup", "prompt-lookup", 0), ("prompt-lookup", "prompt-lookup", 8)]
    cases += [("ngram+context", f"ngram:{ngram}+context", 8), ("model", f"model:{root / 'sdraft'}", 8)]
    rows = []
    for name, spec, tree in cases:
        drafter = make_drafter(spec, verifier)
        started = time.perf_counter()
        try:
            check_sampling_is_exact(verifier, drafter, trials=2000, tree=tree)
            verdict = "exact (chi-square p > 1e-3)"
        except AssertionError as exc:
            verdict = f"FAILED: {exc}"
        rows.append({"drafter": name, "tree": tree, "verdict": verdict, "seconds": time.perf_counter() - started})
    return rows


def distillation(device: str, config_dir: Path, root: Path, tokens: int, batches: list[int]) -> list[dict]:
    from transformers import AutoConfig, AutoModelForCausalLM

    target = root / "gemma3-270m-random"
    target.mkdir()
    for name in TOKENIZER_FILES:
        if (config_dir / name).is_file():
            shutil.copy(config_dir / name, target / name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(target), dtype=torch.bfloat16)
    model.save_pretrained(target)
    del model
    rows = []
    for batch in batches:
        out = root / f"distilled-b{batch}.ngram"
        started = time.perf_counter()
        code, printed, _ = run_cli(
            "ngram", "distill", "--verifier", str(target), "--language", "npi", "--tokens", str(tokens),
            "--batch", str(batch), "--device", device, "--out", str(out), "--no-progress", "--json",
        )  # fmt: skip
        seconds = time.perf_counter() - started
        report = json.loads(printed) if code == 0 else {}
        rows.append({"batch": batch, "exit": code, "seconds": seconds, "tokens": report.get("tokens")})
    return rows


def main(
    device: str = typer.Option("cuda", help="cpu | cuda[:N]"),
    verifier_config: Path = typer.Option(..., help="Directory with the embedded verifier's config and tokenizer."),
    distill_tokens: int = typer.Option(8000, help="Tokens each distillation samples (the default's)."),
    batch_large: int = typer.Option(100, help="The larger distillation batch."),
    out: Path = typer.Option(Path("cuda-check.json"), help="JSON report to write."),
) -> None:
    report: dict = {"device": device, "torch": torch.__version__}
    if device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name(device)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for part, run in (
            ("greedy_identity", lambda: greedy_identity(device, root)),
            ("exact_sampling", lambda: exact_sampling(device, root)),
            ("distillation", lambda: distillation(device, verifier_config, root, distill_tokens, [10, batch_large])),
        ):
            started = time.perf_counter()
            report[part] = run()
            print(f"{part}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
            write_atomic(out, json.dumps(report, indent=1) + "\n")
    identity = report["greedy_identity"]
    lines = [f"greedy identical {sum(r['identical'] for r in identity)}/{len(identity)}"]
    lines += [f"sampled {r['drafter']} tree {r['tree']}: {r['verdict']}" for r in report["exact_sampling"]]
    lines += [f"distill batch {r['batch']}: {r['seconds']:.1f} s (exit {r['exit']})" for r in report["distillation"]]
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
