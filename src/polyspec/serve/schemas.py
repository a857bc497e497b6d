"""Request bodies of the OpenAI-compatible endpoints.

Fields follow OpenAI's; those polyspec cannot honour are accepted only at their neutral value
(n = 1, no penalties, no log-probabilities) so that a client's defaults pass and anything else is
a clear 400. Extension fields: top_k, repetition_penalty, penalty_window, drafter (a drafter
spec for this request), gamma. Unknown fields are refused.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 4


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class Sampling(BaseModel):
    """What both endpoints take."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=0.0, le=0.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=0.0, le=0.0)] | None = None
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None
    user: str | None = None
    # polyspec's extensions
    top_k: Annotated[int, Field(ge=0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    penalty_window: Annotated[int, Field(ge=0)] | None = None
    drafter: str | None = None
    gamma: Annotated[int, Field(ge=1, le=64)] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        if value is None:
            return value
        stops = [value] if isinstance(value, str) else value
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int]
    echo: Literal[False] | None = None
    logprobs: Annotated[int, Field(ge=0, le=0)] | None = None
    best_of: Annotated[int, Field(ge=1, le=1)] | None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], str):
            if len(value) != 1:
                raise ValueError("one prompt per request")
            value = value[0]
        if not value:
            raise ValueError("the prompt is empty")
        return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: Literal[False] | None = None
    top_logprobs: None = None

    def chat(self) -> list[dict]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]
