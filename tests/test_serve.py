"""The OpenAI-compatible server, started on a loopback port inside the tests and called with the
real `openai` client (and httpx for what the client cannot send)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import openai
import pytest
from fixtures import build_tokenizer, run_cli, tiny_gemma

import polyspec
from polyspec.serve.app import build_app

MODEL = "tiny"
PROMPTS = ["w1 w2 w3 w4 w1 w2", "w5 w6 w7 w5 w6 w7 w5", "w10 w11 w12 w13 w14 w15 w10 w11"]
TEMPLATE = "<bos>{% for m in messages %} {{ m['content'] }}{% endfor %}"


@contextmanager
def serving(app):
    """uvicorn in a thread on a free loopback port; stopped (and its worker with it) on exit."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive()


class SlowDrafter:
    """Plain decoding that takes `delay` seconds per step and records which sequence each step
    belongs to, so that a test can see requests run one after another."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.log: list[tuple[str, tuple[int, ...]]] = []

    def start(self, prompt_ids, processor, generator) -> None:
        self.log.append(("start", tuple(prompt_ids[:5])))

    def propose(self, context, k):
        from polyspec.types import EMPTY_DRAFT

        self.log.append(("step", tuple(context[:5])))
        time.sleep(self.delay)
        return EMPTY_DRAFT


@pytest.fixture(scope="module")
def chat_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def engine(chat_tokenizer):
    return polyspec.Engine(model=tiny_gemma(seed=1), tokenizer=chat_tokenizer, name=MODEL, drafter="prompt-lookup")


@pytest.fixture(scope="module")
def base_url(engine):
    with serving(build_app(engine)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=30)


def metric(base_url: str, name: str, **labels) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f"polyspec_{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name} {labels} in {text}")


def test_completions_equal_the_engine(client, engine):
    for prompt in PROMPTS:
        expected = engine.generate(prompt, max_new_tokens=20)
        response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
        choice = response.choices[0]
        assert choice.text == expected.text
        assert choice.finish_reason == "length"
        assert response.usage.completion_tokens == len(expected.token_ids) == 20
        assert response.usage.prompt_tokens == len(engine.encode(prompt))
        assert response.model == MODEL and response.object == "text_completion"
        stats = response.model_extra["polyspec"]
        assert stats["verifier_calls"] == expected.stats.verifier_calls
        assert stats["accepted"] == expected.stats.accepted


def test_per_request_sampling_drafter_and_stop(client, engine):
    prompt = PROMPTS[1]
    options = {"temperature": 0.8, "top_p": 0.9, "seed": 3}
    expected = engine.generate(prompt, drafter="none", max_new_tokens=24, top_k=5, repetition_penalty=1.2, **options)
    response = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=24,
        extra_body={"drafter": "none", "top_k": 5, "repetition_penalty": 1.2},
        **options,
    )
    assert response.choices[0].text == expected.text
    assert response.model_extra["polyspec"]["drafted"] == 0  # the request's drafter, not the default
    words = expected.text.split(" ")
    stop = " ".join(words[3:5])
    stopped = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=24,
        stop=[stop],
        extra_body={"drafter": "none", "top_k": 5, "repetition_penalty": 1.2},
        **options,
    )
    assert stopped.choices[0].text == expected.text[: expected.text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_token_id_prompts(client, engine):
    ids = engine.encode(PROMPTS[0])
    response = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert response.choices[0].text == engine.generate(ids, max_new_tokens=8).text


def test_chat_uses_the_template(client, engine, chat_tokenizer):
    messages = [{"role": "system", "content": "w3 w4"}, {"role": "user", "content": "w1 w2 w3 w4 w1"}]
    ids = chat_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    expected = engine.generate(list(ids), max_new_tokens=12)
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    assert response.choices[0].message.content == expected.text
    assert response.choices[0].message.role == "assistant"
    assert response.usage.prompt_tokens == len(ids)
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_streaming_equals_non_streaming(client, base_url):
    for prompt in PROMPTS:
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0)
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=30,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == whole.choices[0].text
        assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # it did stream
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].usage.completion_tokens == 30 and not chunks[-1].choices
    # The wire format: server-sent events of OpenAI chunks, ending with [DONE].
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 5, "stream": True, "temperature": 0}
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "text_completion"


def test_stop_strings_in_a_stream(client, engine):
    prompt = PROMPTS[2]
    full = engine.generate(prompt, max_new_tokens=30).text
    stop = " ".join(full.split(" ")[4:6])
    chunks = list(
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=stop, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == full[: full.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def bad_request(call, **kwargs) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call(**kwargs)
    error = caught.value
    body = error.response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]
    assert 400 <= error.status_code < 500
    return error


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(client, base_url):
    create = client.completions.create
    ok = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}  # greedy: no chance of an early end
    cases = [
        ({"temperature": 3.0}, 400, "temperature"),
        ({"top_p": 0.0}, 400, "top_p"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"n": 2}, 400, "n"),
        ({"presence_penalty": 0.5}, 400, "presence_penalty"),
        ({"extra_body": {"top_k": -1}}, 400, "top_k"),
        ({"extra_body": {"repetition_penalty": 0}}, 400, "repetition_penalty"),
        ({"extra_body": {"no_such_field": 1}}, 400, "no_such_field"),
        ({"extra_body": {"drafter": "bogus"}}, 400, "drafter"),
        ({"extra_body": {"drafter": "ngram:/no/such.ngram"}}, 400, None),
        ({"model": "other-model"}, 404, "model"),
        ({"max_tokens": 600}, 400, "max_tokens"),
        ({"prompt": " ".join(["w1"] * 600)}, 400, "prompt"),
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ]
    for change, status, param in cases:
        error = bad_request(create, **{**ok, **change})
        assert error.status_code == status, change
        assert error.response.json()["error"]["param"] == param, change
    assert bad_request(create, **{**ok, "max_tokens": 600}).code == "context_length_exceeded"
    assert bad_request(create, **{**ok, "extra_body": {"no_such_field": 1}}).response.json()["error"]["message"] == (
        "Unrecognized request argument supplied: no_such_field"
    )
    error = bad_request(client.chat.completions.create, model=MODEL, messages=[], max_tokens=3)
    assert error.response.json()["error"]["param"] == "messages"
    for raw in (b"{not json", b"", b"[1, 2]"):
        response = httpx.post(
            base_url + "/v1/completions", content=raw, headers={"content-type": "application/json"}, timeout=10
        )
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(base_url + "/v1/nothing", timeout=10).json()["error"]["code"] == "not_found"
    assert create(**ok).choices[0].finish_reason == "length"  # still serving


def test_chat_without_a_template_is_a_clear_400(tokenizer):
    engine = polyspec.Engine(model=tiny_gemma(seed=2), tokenizer=tokenizer, name=MODEL)
    with serving(build_app(engine)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
        error = bad_request(client.chat.completions.create, model=MODEL, messages=[{"role": "user", "content": "w1"}])
        assert error.status_code == 400 and "chat template" in error.message
        completion = client.completions.create(model=MODEL, prompt="w1 w2", max_tokens=3, temperature=0)
        assert completion.usage.completion_tokens == 3


def test_models_health_and_metrics(client, base_url):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    assert httpx.get(base_url + "/health", timeout=10).json()["status"] == "ok"
    before = metric(base_url, "generated_tokens_total")
    requests = metric(base_url, "requests_total", outcome="ok")
    response = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0)
    stats = response.model_extra["polyspec"]
    assert metric(base_url, "generated_tokens_total") == before + 16
    assert metric(base_url, "requests_total", outcome="ok") == requests + 1
    assert metric(base_url, "queue_depth") == 0
    text = httpx.get(base_url + "/metrics", timeout=10).text
    for name in ("drafted_tokens_total", "accepted_tokens_total", "acceptance_rate", "tokens_per_verifier_call"):
        assert re.search(rf"^# TYPE polyspec_{name} (counter|gauge)$", text, re.M), name
    assert metric(base_url, "tokens_per_verifier_call") > 1.0  # prompt lookup accepted drafts
    assert stats["drafted"] >= stats["accepted"] > 0
    drafted, accepted = metric(base_url, "drafted_tokens_total"), metric(base_url, "accepted_tokens_total")
    assert metric(base_url, "acceptance_rate") == pytest.approx(accepted / drafted)


@pytest.fixture
def slow_server(tokenizer):
    drafter = SlowDrafter(delay=0.01)
    engine = polyspec.Engine(model=tiny_gemma(seed=3), tokenizer=tokenizer, name=MODEL, drafter=drafter)
    with serving(build_app(engine)) as url:
        yield url, engine, drafter


def test_two_concurrent_clients_are_served_one_after_the_other(slow_server):
    url, engine, drafter = slow_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    prompts = PROMPTS[:2]
    expected = {p: engine.generate(p, max_new_tokens=25).text for p in prompts}
    drafter.log.clear()
    results: dict[str, str] = {}

    def run(prompt):
        chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=25, temperature=0, stream=True)
        results[prompt] = "".join(c.choices[0].text for c in chunks)

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # the second arrives while the first runs
    for thread in threads:
        thread.join(60)
    assert results == expected
    # One at a time: all steps of the first sequence come before the second one starts.
    starts = [i for i, (kind, _) in enumerate(drafter.log) if kind == "start"]
    assert len(starts) == 2
    first, second = (drafter.log[i][1] for i in starts)
    assert {step for kind, step in drafter.log[starts[0] : starts[1]] if kind == "step"} == {first}
    assert {step for kind, step in drafter.log[starts[1] :] if kind == "step"} == {second}


def test_a_client_that_leaves_mid_stream_frees_the_worker(slow_server):
    url, engine, drafter = slow_server
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 400, "stream": True, "temperature": 0}
    began = time.monotonic()
    with httpx.Client(timeout=30) as http, http.stream("POST", url + "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert received
    # The connection is closed after a few chunks: the generation stops at its next step.
    deadline = time.monotonic() + 10
    while metric(url, "requests_total", outcome="cancelled") < 1:
        assert time.monotonic() < deadline, "the generation did not stop"
        time.sleep(0.05)
    assert metric(url, "generated_tokens_total") < 400
    assert time.monotonic() - began < 400 * drafter.delay  # far sooner than the whole generation
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    response = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=5, temperature=0)
    assert response.choices[0].text == engine.generate(PROMPTS[1], max_new_tokens=5).text
    assert metric(url, "queue_depth") == 0 and metric(url, "requests_running") == 0


def test_serve_command_refuses_bad_options():
    code, _, err = run_cli("serve", "--drafter", "bogus")
    assert code == 2 and "unknown drafter" in err
    code, _, err = run_cli("serve", "--gamma", "0")
    assert code == 2 and "gamma" in err
    code, _, err = run_cli("serve", "--port", "70000")
    assert code == 2 and "port" in err
