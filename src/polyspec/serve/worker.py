"""The one worker: requests are queued first come, first served and run one at a time.

One verifier holds one cache, so generations cannot interleave in it; and on a CPU the verifier
is compute-bound, so running speculative steps of several requests side by side (or batching
drafts of different lengths) would only share the same cores. The worker thread owns the
engine: prompts are tokenised, drafters built and tokens decoded there and nowhere else.

Each job reports to its request handler through an asyncio queue, in order:
("ready", prompt_tokens) or ("error", exception), then ("chunk", Chunk)..., then
("done", Generation) or ("error", exception). A job whose client left is skipped if it has not
started, and stopped before its next verifier call if it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from polyspec.errors import UserError
from polyspec.serve.metrics import Metrics


class RequestError(UserError):
    """A request the server refuses (400 unless status says otherwise), OpenAI-style."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


@dataclass
class Job:
    """prepare(engine) -> (prompt token count, Stream) runs on the worker thread."""

    prepare: Callable
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, kind: str, value) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the server is stopping
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Worker:
    def __init__(self, engine, metrics: Metrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="polyspec-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        self.metrics.queued(+1)
        self._jobs.put(job)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            self.metrics.started()
            try:
                self._run(job)
            finally:
                self.metrics.finished()

    def _run(self, job: Job) -> None:
        metrics = self.metrics
        if job.cancelled.is_set():
            metrics.add(requests_cancelled=1)
            return
        try:
            prompt_tokens, stream = job.prepare(self.engine)
        except UserError as exc:
            metrics.add(requests_error=1)
            job.emit("error", exc)
            return
        except Exception as exc:  # a bug must not stop the worker: the request gets a 500
            metrics.add(requests_error=1)
            job.emit("error", exc)
            return
        job.emit("ready", prompt_tokens)
        metrics.add(prompt_tokens=prompt_tokens)
        generated = 0
        try:
            for chunk in stream.chunks():
                generated += len(chunk.token_ids)
                job.emit("chunk", chunk)
                if job.cancelled.is_set():
                    break
        except Exception as exc:
            stream.close()
            metrics.add(requests_error=1, generated_tokens=generated)
            job.emit("error", exc)
            return
        if stream.generation is None:  # the client left: stopped before the next verifier call
            stream.close()
            metrics.add(requests_cancelled=1, generated_tokens=generated)
            return
        stats = stream.generation.stats
        metrics.add(
            requests_ok=1,
            generated_tokens=generated,
            drafted_tokens=stats.drafted,
            accepted_tokens=stats.accepted,
            verifier_calls=stats.verifier_calls,
            generation_seconds=stats.seconds,
        )
        job.emit("done", stream.generation)
