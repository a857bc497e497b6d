"""The server's counters, written out in Prometheus' text exposition format."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields


@dataclass
class Counters:
    requests_ok: int = 0
    requests_error: int = 0
    requests_cancelled: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verifier_calls: int = 0
    generation_seconds: float = 0.0


class Metrics:
    """Updated by the worker and the request handlers; read by /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters = Counters()
        self.waiting = 0  # requests queued, not yet started
        self.running = 0

    def add(self, **amounts) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self.counters, name, getattr(self.counters, name) + amount)

    def queued(self, delta: int) -> None:
        with self._lock:
            self.waiting += delta

    def started(self) -> None:
        with self._lock:
            self.waiting -= 1
            self.running += 1

    def finished(self) -> None:
        with self._lock:
            self.running -= 1

    def snapshot(self) -> tuple[Counters, int, int]:
        with self._lock:
            return (
                Counters(**{f.name: getattr(self.counters, f.name) for f in fields(Counters)}),
                self.waiting,
                self.running,
            )

    def render(self, model: str) -> str:
        c, waiting, running = self.snapshot()
        acceptance = c.accepted_tokens / c.drafted_tokens if c.drafted_tokens else 0.0
        per_call = c.generated_tokens / c.verifier_calls if c.verifier_calls else 0.0
        label = '{model="' + model.replace("\\", "\\\\").replace('"', '\\"') + '"}'
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP polyspec_{name} {help_text}")
            lines.append(f"# TYPE polyspec_{name} {kind}")
            for labels, value in samples:
                lines.append(f"polyspec_{name}{labels} {_number(value)}")

        def outcome(value: str) -> str:
            return label[:-1] + f',outcome="{value}"' + "}"

        metric(
            "requests_total",
            "counter",
            "Requests finished, by outcome (ok, error: refused or failed, cancelled: the client left).",
            [
                (outcome("ok"), c.requests_ok),
                (outcome("error"), c.requests_error),
                (outcome("cancelled"), c.requests_cancelled),
            ],
        )
        metric("prompt_tokens_total", "counter", "Prompt tokens of the requests run.", [(label, c.prompt_tokens)])
        metric("generated_tokens_total", "counter", "Tokens generated.", [(label, c.generated_tokens)])
        metric("drafted_tokens_total", "counter", "Draft tokens judged by the verifier.", [(label, c.drafted_tokens)])
        metric("accepted_tokens_total", "counter", "Draft tokens accepted.", [(label, c.accepted_tokens)])
        metric("verifier_calls_total", "counter", "Verifier forward calls while decoding.", [(label, c.verifier_calls)])
        metric(
            "generation_seconds_total",
            "counter",
            "Seconds spent generating (prefill included).",
            [(label, c.generation_seconds)],
        )
        metric("acceptance_rate", "gauge", "Accepted over drafted tokens, since the start.", [(label, acceptance)])
        metric(
            "tokens_per_verifier_call",
            "gauge",
            "Generated tokens per verifier call since the start: the estimated speedup over plain decoding.",
            [(label, per_call)],
        )
        metric("queue_depth", "gauge", "Requests waiting for the worker.", [(label, waiting)])
        metric("requests_running", "gauge", "Requests being generated (at most 1).", [(label, running)])
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
