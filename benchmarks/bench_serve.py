"""Serving overhead: streamed tokens/s through the HTTP server against Engine.generate, and time
to first token against one prefill plus one decoding step, on the same prompts, interleaved.

    .venv/bin/python benchmarks/bench_serve.py --out runs/serve.json

For each prompt and repeat, in one process: (1) the Decoder's prefill plus its first step, timed
directly; (2) Engine.generate; (3) the same request streamed through the server (uvicorn on a
loopback port, read as server-sent events by httpx), from sending the request to `[DONE]`, and
to the first chunk with text. Greedy, so all three produce the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time
from pathlib import Path

from polyspec.files import write_atomic

PROMPTS = [
    "Article 1. All human beings are born free and equal in dignity and rights. Article 2. Everyone is "
    "entitled to all the rights and freedoms set forth in this Declaration. Article 3.",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
    "Monday: run 5 km. Tuesday: swim 1 km. Wednesday: run 5 km. Thursday: swim 1 km. Friday:",
    "The colours of the flag are red, white and blue. The colours of the sky are",
]


def start_server(app):
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


def streamed(http, url: str, model: str, prompt: str, drafter: str, max_tokens: int) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "drafter": drafter,
    }
    began = time.perf_counter()
    first = None
    text, tokens = "", 0
    with http.stream("POST", url + "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                first = first or time.perf_counter()
                text += chunk["choices"][0]["text"]
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    wall = time.perf_counter() - began
    return {"seconds": wall, "ttft": first - began, "tokens": tokens, "text": text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier", default="gemma3-270m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--drafter", default="prompt-lookup")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import httpx
    import torch

    from polyspec.api import Engine
    from polyspec.sampling import SamplingConfig
    from polyspec.serve.app import build_app

    load_before = os.getloadavg()
    engine = Engine(args.verifier, dtype=args.dtype)
    server, thread, url = start_server(build_app(engine))
    http = httpx.Client(timeout=600)
    drafter = engine.drafter(args.drafter)
    engine.generate(PROMPTS[0], drafter=drafter, max_new_tokens=8)  # warm up
    streamed(http, url, engine.name, PROMPTS[0], args.drafter, 8)
    rows = []
    for repeat in range(args.repeats):
        for index, prompt in enumerate(PROMPTS):
            ids = engine.encode(prompt)
            with torch.inference_mode():
                greedy = SamplingConfig()
                steps = engine.decoder.stream(ids, drafter, sampling=greedy, max_new_tokens=args.max_new_tokens)
                t0 = time.perf_counter()
                next(steps)
                prefill_step = time.perf_counter() - t0
                steps.close()
            order = ("engine", "server") if (repeat + index) % 2 == 0 else ("server", "engine")
            row = {"prompt": index, "repeat": repeat, "prefill_step": prefill_step, "order": order}
            for kind in order:
                if kind == "engine":
                    t0 = time.perf_counter()
                    out = engine.generate(prompt, drafter=drafter, max_new_tokens=args.max_new_tokens)
                    row["engine_seconds"] = time.perf_counter() - t0
                    row["engine_tokens"] = len(out.token_ids)
                    row["engine_text"] = out.text
                    row["tokens_per_call"] = out.stats.tokens_per_call
                else:
                    result = streamed(http, url, engine.name, prompt, args.drafter, args.max_new_tokens)
                    row["server_seconds"], row["server_tokens"] = result["seconds"], result["tokens"]
                    row["ttft"], row["server_text"] = result["ttft"], result["text"]
            row["same_text"] = row.pop("engine_text") == row.pop("server_text")
            row["engine_tps"] = row["engine_tokens"] / row["engine_seconds"]
            row["server_tps"] = row["server_tokens"] / row["server_seconds"]
            row["throughput_ratio"] = row["server_tps"] / row["engine_tps"]
            row["ttft_ratio"] = row["ttft"] / row["prefill_step"]
            rows.append(row)
            print(
                f"prompt {index} repeat {repeat}: engine {row['engine_tps']:.1f} tok/s, server {row['server_tps']:.1f}"
                f" tok/s (x{row['throughput_ratio']:.3f}); ttft {row['ttft'] * 1e3:.1f} ms vs prefill+step"
                f" {prefill_step * 1e3:.1f} ms (x{row['ttft_ratio']:.3f}); same text {row['same_text']}",
                flush=True,
            )
    server.should_exit = True
    thread.join(30)
    summary = {
        "verifier": args.verifier,
        "dtype": str(next(engine.model.parameters()).dtype),
        "drafter": args.drafter,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "engine_tps_total": sum(r["engine_tokens"] for r in rows) / sum(r["engine_seconds"] for r in rows),
        "server_tps_total": sum(r["server_tokens"] for r in rows) / sum(r["server_seconds"] for r in rows),
        "throughput_ratio_median": statistics.median(r["throughput_ratio"] for r in rows),
        "ttft_ratio_median": statistics.median(r["ttft_ratio"] for r in rows),
        "ttft_ms_median": 1e3 * statistics.median(r["ttft"] for r in rows),
        "prefill_step_ms_median": 1e3 * statistics.median(r["prefill_step"] for r in rows),
        "all_same_text": all(r["same_text"] for r in rows),
    }
    summary["throughput_ratio_total"] = summary["server_tps_total"] / summary["engine_tps_total"]
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
