"""The FastAPI app: OpenAI's completions and chat completions over one `polyspec.Engine`.

    app = build_app(engine)          # then uvicorn.run(app, host=..., port=...)

Requests wait in one first-come-first-served queue and run one at a time (`worker.py`). A
streamed response is OpenAI's chunks as server-sent events, ending with `data: [DONE]`. Every
refusal is a 4xx with OpenAI's error body {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from polyspec.api import Engine
from polyspec.errors import UserError
from polyspec.serve.metrics import Metrics
from polyspec.serve.schemas import ChatRequest, CompletionRequest, Sampling
from polyspec.serve.worker import Job, RequestError, Worker
from polyspec.specs import parse_drafter

DEFAULT_MAX_TOKENS = 256  # when a request names none (capped by what the context leaves)
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "length": "length"}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 404 and code is None:
        code = "not_found"
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """The first problem of a body pydantic refused, said as OpenAI says it."""
    errors = exc.errors()
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    kind = first.get("type", "")
    if kind == "json_invalid":
        return error_response(400, "We could not parse the JSON body of your request: it is not valid JSON.")
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if kind == "extra_forbidden":
        return error_response(400, f"Unrecognized request argument supplied: {param}", param, "unknown_parameter")
    if kind == "missing":
        if param is None:
            return error_response(400, "The request needs a JSON body.")
        return error_response(400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return error_response(400, f"Invalid value for '{param}': {message}", param, "invalid_value")


class Server:
    """What the endpoints share: the engine (touched only by the worker), the queue, the counters."""

    def __init__(self, engine: Engine, model_name: str | None = None, default_max_tokens: int = DEFAULT_MAX_TOKENS):
        self.engine = engine
        self.model_name = model_name or engine.name
        self.default_max_tokens = default_max_tokens
        self.metrics = Metrics()
        self.worker = Worker(engine, self.metrics)
        self.created = int(time.time())

    def check(self, body: Sampling) -> None:
        """What can be refused before the request is queued."""
        if body.model != self.model_name:
            raise RequestError(
                f"The model '{body.model}' does not exist: this server serves '{self.model_name}'.",
                "model",
                "model_not_found",
                404,
            )
        if body.drafter is not None:
            try:
                parse_drafter(body.drafter)
            except UserError as exc:
                raise RequestError(str(exc), "drafter", "invalid_value") from exc

    def options(self, body: Sampling, prompt_tokens: int, max_tokens: int | None, param: str) -> dict:
        """The engine's arguments for a request whose prompt has `prompt_tokens` tokens."""
        limit = self.engine.max_length
        if limit is not None and prompt_tokens >= limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens, but the prompt has {prompt_tokens}.",
                param,
                "context_length_exceeded",
            )
        if max_tokens is None:
            max_tokens = self.default_max_tokens
            if limit is not None:
                max_tokens = min(max_tokens, limit - prompt_tokens)
        elif limit is not None and prompt_tokens + max_tokens > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens, but {prompt_tokens} prompt tokens and "
                f"{max_tokens} completion tokens were requested. Reduce the prompt or max_tokens.",
                "max_tokens",
                "context_length_exceeded",
            )
        options = {
            "max_new_tokens": max_tokens,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "top_k": body.top_k or 0,
            "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
            "penalty_window": body.penalty_window or 0,
            "stop_strings": body.stop_strings(),
            "seed": body.seed if body.seed is not None else int.from_bytes(uuid.uuid4().bytes[:7], "big"),
        }
        if body.gamma is not None:
            options["gamma"] = body.gamma
        return options


def build_app(engine: Engine, model_name: str | None = None, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> FastAPI:
    """The server over `engine`; its worker starts and stops with the app's lifespan."""
    server = Server(engine, model_name, default_max_tokens)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.worker.start()
        try:
            yield
        finally:
            server.worker.stop()

    app = FastAPI(title="polyspec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        server.metrics.add(requests_error=1)
        return _validation_error(exc)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError):
        server.metrics.add(requests_error=1)
        return error_response(exc.status, str(exc), exc.param, exc.code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = "Unknown URL: " + request.url.path if exc.status_code == 404 else str(exc.detail)
        return error_response(exc.status_code, message)

    @app.get("/health")
    async def health():
        _, waiting, running = server.metrics.snapshot()
        return {"status": "ok", "model": server.model_name, "queue_depth": waiting, "running": running}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.metrics.render(server.model_name), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if model != server.model_name:
            raise RequestError(f"The model '{model}' does not exist.", "model", "model_not_found", 404)
        return _model_card(server)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        server.check(body)

        def prepare(engine: Engine):
            prompt = body.prompt
            ids = engine.prompt_ids(prompt if isinstance(prompt, str) else list(prompt))
            options = server.options(body, len(ids), body.max_tokens, "prompt")
            return len(ids), engine.stream(ids, body.drafter, **options)

        return await _respond(server, request, body, prepare, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        server.check(body)
        if not server.engine.has_chat_template:
            raise RequestError(
                f"The model '{server.model_name}' has no chat template: use /v1/completions with a plain prompt.",
                "messages",
                "chat_template_missing",
            )
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens

        def prepare(engine: Engine):
            try:
                ids = engine.chat_prompt(body.chat())
            except UserError as exc:
                raise RequestError(str(exc), "messages") from exc
            options = server.options(body, len(ids), max_tokens, "messages")
            return len(ids), engine.stream(ids, body.drafter, **options)

        return await _respond(server, request, body, prepare, chat=True)

    return app


def _model_card(server: Server) -> dict:
    return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "polyspec"}


async def _next_event(job: Job, request: Request):
    """The job's next event, or None once the client has gone (the job is then cancelled)."""
    getting = asyncio.ensure_future(job.events.get())
    leaving = asyncio.ensure_future(_disconnected(request))
    done, _ = await asyncio.wait({getting, leaving}, return_when=asyncio.FIRST_COMPLETED)
    if getting in done:
        leaving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leaving
        return getting.result()
    getting.cancel()
    job.cancelled.set()
    return None


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _as_error(exc: Exception) -> JSONResponse:
    if isinstance(exc, RequestError):
        return error_response(exc.status, str(exc), exc.param, exc.code)
    if isinstance(exc, UserError):
        return error_response(400, str(exc))
    return error_response(500, f"The server failed on this request: {type(exc).__name__}")


async def _respond(server: Server, request: Request, body: Sampling, prepare, chat: bool) -> Response:
    job = Job(prepare=prepare, loop=asyncio.get_running_loop())
    server.worker.submit(job)
    event = await _next_event(job, request)
    if event is None:
        return Response(status_code=499)
    kind, value = event
    if kind == "error":
        return _as_error(value)
    prompt_tokens = value
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _sse(server, job, ident, prompt_tokens, chat, include_usage)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    pieces: list[str] = []
    while True:
        event = await _next_event(job, request)
        if event is None:
            return Response(status_code=499)
        kind, value = event
        if kind == "chunk":
            pieces.append(value.text)
        elif kind == "error":
            return _as_error(value)
        else:
            break
    generation = value
    usage = _usage(prompt_tokens, len(generation.token_ids))
    reason = FINISH_REASONS.get(generation.stop_reason, "stop")
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": generation.text},
            "logprobs": None,
            "finish_reason": reason,
        }
    else:
        choice = {"index": 0, "text": generation.text, "logprobs": None, "finish_reason": reason}
    return JSONResponse(
        {
            "id": ident,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": server.model_name,
            "choices": [choice],
            "usage": usage,
            "polyspec": _stats(generation),
        }
    )


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _stats(generation) -> dict:
    s = generation.stats
    return {
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": s.acceptance_rate,
        "verifier_calls": s.verifier_calls,
        "tokens_per_call": s.tokens_per_call,
        "seconds": s.seconds,
        "stop_reason": generation.stop_reason,
    }


async def _sse(server: Server, job: Job, ident: str, prompt_tokens: int, chat: bool, include_usage: bool):
    """OpenAI's stream of chunks as server-sent events. If the client leaves, starlette cancels
    this generator and the job stops before its next verifier call."""
    created = int(time.time())
    model = server.model_name
    kind_name = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, role: bool = False, extra: dict | None = None) -> bytes:
        if chat:
            delta: dict = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        data = {"id": ident, "object": kind_name, "created": created, "model": model, "choices": [choice]}
        if include_usage:
            data["usage"] = None
        if extra:
            data.update(extra)
        return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8") + b"\n\n"

    completed = False
    try:
        if chat:
            yield chunk("", None, role=True)
        while True:
            kind, value = await job.events.get()
            if kind == "chunk":
                if value.text:
                    yield chunk(value.text, None)
                continue
            if kind == "error":
                # Headers are out: say it in the stream, as OpenAI does, and end it.
                body = _as_error(value).body
                yield b"data: " + body + b"\n\n"
                break
            generation = value
            reason = FINISH_REASONS.get(generation.stop_reason, "stop")
            yield chunk(None if chat else "", reason, extra={"polyspec": _stats(generation)})
            if include_usage:
                data = {
                    "id": ident,
                    "object": kind_name,
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": _usage(prompt_tokens, len(generation.token_ids)),
                }
                yield b"data: " + json.dumps(data).encode("utf-8") + b"\n\n"
            break
        yield b"data: [DONE]\n\n"
        completed = True
    finally:
        if not completed:
            job.cancelled.set()
