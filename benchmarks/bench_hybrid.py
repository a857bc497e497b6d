"""Rollback cost on a hybrid Qwen3.5 model, and speculative against plain decoding.

Part 1 (rollback overhead). Each round feeds verify calls of gamma + 1 tokens and keeps
1 .. gamma + 1 of them in turn (so every acceptance count occurs equally often), for three
engines on the same random model, taking turns call by call:
- stock: the model's own forward (chunked delta rule) and a plain cache crop, which leaves the
  recurrent states wrong: the cost of a verify call with no state rollback at all;
- states: polyspec's per-position states (stepwise rule, copy back on rollback);
- refeed: polyspec's snapshot and re-feed (chunked rule; the states are copied before each verify
  call, restored and the kept tokens fed again on rollback).
Overhead per verify call = (forward + rollback time) - stock forward time, as a share of the
stock forward.

Part 2 (end to end, greedy). Plain decoding against speculative decoding with a drafter that is
always right at no cost: it proposes the tokens the verifier will choose, known in advance.
In bfloat16 a verify call over several tokens rounds differently from single-token steps and
flips near-ties, so those tokens are found by running the speculative decoding itself until
it proposes what it then accepts (the verifier's plain greedy output is the first guess).
Also the verifier itself as a `model:` drafter, which pays a full verifier step per drafted
token and so cannot beat plain decoding; it shows what that costs. transformers' own greedy
`generate` (which refuses to speculate on this model) is timed for reference.

    .venv/bin/python benchmarks/bench_hybrid.py --out hybrid.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fixtures import OracleDrafter  # noqa: E402

from polyspec.cached_lm import CachedLM  # noqa: E402
from polyspec.decoding import Decoder
from polyspec.drafters.model import ModelDrafter
from polyspec.models import LoadedModel
from polyspec.state_rollback import CropPolicy


def hybrid_model(layers: int, hidden: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    """A random Qwen3.5 with the real models' layer pattern (3 linear : 1 full) and head shapes
    scaled to `hidden`."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    heads = hidden // 64
    config = Qwen3_5TextConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=max(1, heads // 2),
        linear_num_value_heads=heads,
        max_position_embeddings=4096,
        eos_token_id=1,
        bos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # confident logits, like a trained model's
    return model.to(dtype)


def rollback_rounds(engines: dict, prefix: list[int], steps: list[list[int]], keeps: list[int], rounds: int):
    """Feeds every step after `prefix` to each engine, keeping `keeps[i]` tokens, the engines taking
    turns call by call so that load changes hit them alike. Returns per-engine lists of the
    per-round median forward time and mean rollback time."""
    times = {name: {"forward": [], "rollback": []} for name in engines}
    for _ in range(rounds):
        calls = {name: ([], []) for name in engines}
        for lm in engines.values():
            lm.reset()
            lm.forward(prefix, num_logits=1)
        for tokens, keep in zip(steps, keeps, strict=True):
            for name, lm in engines.items():
                t0 = time.perf_counter()
                lm.forward(tokens)
                t1 = time.perf_counter()
                lm.rollback(lm.length - len(tokens) + keep)
                t2 = time.perf_counter()
                calls[name][0].append(t1 - t0)
                calls[name][1].append(t2 - t1)
        for name, (forward_s, rollback_s) in calls.items():
            times[name]["forward"].append(statistics.median(forward_s))
            times[name]["rollback"].append(statistics.mean(rollback_s))
    return times


def part_rollback(model, gamma: int, args) -> dict:
    rng = random.Random(0)
    vocab = model.config.vocab_size
    width = gamma + 1
    prefix = [rng.randrange(4, vocab) for _ in range(args.prefix)]
    steps = [[rng.randrange(4, vocab) for _ in range(width)] for _ in range(args.calls)]
    keeps = [1 + i % width for i in range(args.calls)]
    engines = {
        # Cuts back only what cropping can: the timing of a verify call with no state rollback.
        "stock": CachedLM(model, rollback=CropPolicy()),
        "states": CachedLM(model, rollback="states"),
        "refeed": CachedLM(model, rollback="refeed"),
    }
    rollback_rounds(engines, prefix, steps[:4], keeps[:4], rounds=1)  # warm-up
    times = rollback_rounds(engines, prefix, steps, keeps, args.rounds)
    stock = statistics.median(times["stock"]["forward"])
    result = {"verify_width": width, "stock_forward_ms": 1e3 * stock}
    for name in ("states", "refeed"):
        forward = statistics.median(times[name]["forward"])
        rollback = statistics.median(times[name]["rollback"])
        overhead = forward + rollback - stock
        result[name] = {
            "forward_ms": 1e3 * forward,
            "rollback_ms": 1e3 * rollback,
            "overhead_ms": 1e3 * overhead,
            "overhead_share": overhead / stock,
        }
    return result


def always_right(decoder: Decoder, prompt: list[int], guess: list[int], gamma: int, run: dict):
    """Speculative decoding with an oracle that proposes what it will accept: each pass fixes at
    least the first token the previous guess got wrong, so a few passes converge."""
    for _ in range(len(guess)):
        result = decoder.generate(prompt, OracleDrafter(prompt, guess), gamma=gamma, **run)
        if result.token_ids == guess:
            return result
        guess = result.token_ids
    raise RuntimeError("the always-right drafter did not converge")


def hf_generate_seconds(model, prompt: list[int], max_new_tokens: int) -> float:
    """transformers' own greedy decoding, for reference (it cannot speculate on this model)."""
    start = time.perf_counter()
    ids = torch.tensor([prompt])
    model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=0)
    return time.perf_counter() - start


def part_decoding(model, args) -> dict:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = model.config.vocab_size
    core = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t3"))
    verifier = LoadedModel(model=model, tokenizer=PreTrainedTokenizerFast(tokenizer_object=core), name="hybrid")
    decoder = Decoder(verifier)
    rng = random.Random(1)
    prompts = [[2, *(rng.randrange(4, vocab) for _ in range(args.prefix))] for _ in range(args.prompts)]
    self_drafter = ModelDrafter(verifier, vocab)
    run = dict(max_new_tokens=args.max_new_tokens, eos_token_ids=frozenset())
    decoder.generate(prompts[0], None, max_new_tokens=8)  # warm-up
    rows = []
    for _ in range(args.repeats):
        for prompt in prompts:
            plain = decoder.generate(prompt, None, **run)
            oracle = always_right(decoder, prompt, plain.token_ids, args.gamma, run)
            itself = decoder.generate(prompt, self_drafter, gamma=args.gamma, **run)
            rows.append(
                {
                    "plain_tok_s": plain.stats.tokens_per_second,
                    "hf_plain_tok_s": args.max_new_tokens / hf_generate_seconds(model, prompt, args.max_new_tokens),
                    "oracle_tok_s": oracle.stats.tokens_per_second,
                    "oracle_alpha": oracle.stats.acceptance_rate,
                    "oracle_identical": oracle.token_ids == plain.token_ids,
                    "self_tok_s": itself.stats.tokens_per_second,
                    "self_identical": itself.token_ids == plain.token_ids,
                }
            )
    plain = statistics.mean(r["plain_tok_s"] for r in rows)
    oracle = statistics.mean(r["oracle_tok_s"] for r in rows)
    itself = statistics.mean(r["self_tok_s"] for r in rows)
    return {
        "runs": len(rows),
        "plain_tok_s": plain,
        "hf_plain_tok_s": statistics.mean(r["hf_plain_tok_s"] for r in rows),
        "oracle_tok_s": oracle,
        "oracle_speedup": statistics.mean(r["oracle_tok_s"] / r["plain_tok_s"] for r in rows),
        "oracle_alpha": statistics.mean(r["oracle_alpha"] for r in rows),
        "oracle_identical": sum(r["oracle_identical"] for r in rows),
        "self_drafter_tok_s": itself,
        "self_drafter_speedup": statistics.mean(r["self_tok_s"] / r["plain_tok_s"] for r in rows),
        "self_identical": sum(r["self_identical"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 3, 4, 5], help="part 1: draft lengths")
    parser.add_argument("--gamma", type=int, default=4, help="part 2: draft length")
    parser.add_argument("--prefix", type=int, default=64, help="prompt tokens before the verify calls")
    parser.add_argument("--calls", type=int, default=30, help="verify calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    # One thread: on a small shared machine, a second one mostly waits for a busy core.
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    parser.add_argument("--skip-decoding", action="store_true")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    model = hybrid_model(args.layers, args.hidden, args.vocab, dtype)
    result = {
        "settings": vars(args),
        "threads": torch.get_num_threads(),
        "load_before": os.getloadavg()[0],
    }
    result["rollback"] = {}
    for gamma in args.gammas:
        result["rollback"][gamma] = part_rollback(model, gamma, args)
        print(json.dumps({f"gamma {gamma}": result["rollback"][gamma]}), flush=True)
    if not args.skip_decoding:
        result["decoding"] = part_decoding(model, args)
        print(json.dumps(result["decoding"], indent=1), flush=True)
    result["load_after"] = os.getloadavg()[0]
    print(f"load average: {result['load_before']:.2f} before, {result['load_after']:.2f} after")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
