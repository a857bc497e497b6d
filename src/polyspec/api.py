"""The Python API: `polyspec.Engine` and `polyspec.generate`.

    engine = polyspec.Engine("gemma3-270m")               # a name, a path or a hub id
    out = engine.generate("Article 1.", drafter="prompt-lookup", max_new_tokens=64)
    out.text, out.token_ids, out.stats.acceptance_rate
    for piece in engine.stream("Article 1.", drafter="prompt-lookup"):
        print(piece, end="")

An engine owns one verifier and one cache, and runs one generation at a time (a second caller
waits for the first). Drafters are given as spec strings (built once and kept) or as drafter
objects (`polyspec.drafters`), and reused across calls. Sampling arguments are named as in
transformers' `generate`. `polyspec.generate(model, tokenizer, input_ids, ...)` takes the main
arguments of `model.generate` and returns what it returns.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from polyspec.decoding import Decoder
from polyspec.drafters.base import Drafter, NoDrafter
from polyspec.errors import UserError
from polyspec.models import LoadedModel
from polyspec.sampling import SamplingConfig
from polyspec.specs import DEFAULT_VERIFIER, load_model, make_drafter, parse_drafter
from polyspec.streaming import TextStream
from polyspec.types import Generation, GenerationStats

DEFAULT_MAX_NEW_TOKENS = 64


def sampling_config(
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
    penalty_window: int = 0,
    do_sample: bool | None = None,
) -> SamplingConfig:
    """The sampling settings of a call. temperature 0 is greedy; do_sample=False is greedy
    whatever the temperature; do_sample=True with temperature 0 samples at temperature 1
    (transformers' default); do_sample=None lets the temperature decide."""
    if do_sample is False:
        temperature = 0.0
    elif do_sample is True and temperature == 0:
        temperature = 1.0
    return SamplingConfig(float(temperature), int(top_k), float(top_p), float(repetition_penalty), int(penalty_window))


@dataclass(frozen=True)
class Chunk:
    """What one verifier call added: the new token ids and the text that became final with them
    (possibly empty: the start of a character or of a stop string is held back)."""

    text: str
    token_ids: list[int]


class Stream(Iterator[str]):
    """The text of one generation, piece by piece, as the verifier accepts tokens.

    Iterating yields non-empty text pieces; `chunks()` yields `Chunk`s (text and token ids per
    verifier call) instead. Once exhausted, `generation` holds the `Generation` (its text is the
    pieces joined). `close()` stops the generation at the next step; the engine is then free.
    """

    def __init__(self, engine: Engine, steps) -> None:
        self._engine = engine
        self._steps = steps
        self._chunks = self._run()
        self.generation: Generation | None = None
        self.token_ids: list[int] = []
        self.text = ""

    def _run(self) -> Iterator[Chunk]:
        engine, steps = self._engine, self._steps
        with engine._exclusive():
            try:
                text = TextStream(engine.tokenizer, steps.stop_strings)
                decoder_steps = steps.start()
                done: Generation | None = None
                while True:
                    try:
                        ids = next(decoder_steps)
                    except StopIteration as finished:
                        done = finished.value
                        break
                    self.token_ids.extend(ids)
                    piece = text.push(ids)
                    self.text += piece
                    yield Chunk(piece, list(ids))
                    if text.stopped:  # found in the text before the loop saw it: end here
                        decoder_steps.close()
                        break
                tail = text.finish()
                self.text += tail
                if tail:
                    yield Chunk(tail, [])
                if done is None:
                    done = Generation(list(self.token_ids), "", GenerationStats(new_tokens=len(self.token_ids)), "")
                reason = "stop_string" if text.stopped else done.stop_reason
                self.generation = replace(done, text=self.text, stop_reason=reason)
            finally:
                steps.close()

    def chunks(self) -> Iterator[Chunk]:
        return self._chunks

    def __next__(self) -> str:
        while True:
            chunk = next(self._chunks)
            if chunk.text:
                return chunk.text

    def close(self) -> None:
        self._chunks.close()


class _Steps:
    """A prepared call of `Decoder.stream`: arguments checked, nothing run yet."""

    def __init__(self, decoder: Decoder, prompt_ids, drafter, stop_strings, options) -> None:
        self.decoder, self.prompt_ids, self.drafter = decoder, prompt_ids, drafter
        self.stop_strings = tuple(stop_strings)
        self.options = options
        self._generator = None

    def start(self):
        self._generator = self.decoder.stream(
            self.prompt_ids, self.drafter, stop_strings=self.stop_strings, **self.options
        )
        return self._generator

    def close(self) -> None:
        if self._generator is not None:
            self._generator.close()


class Engine:
    """One verifier, ready to generate from with any drafter.

    Engine("gemma3-270m"), Engine("path/or/hub-id", dtype="bfloat16", device="cuda"), or
    Engine(model=transformers_model, tokenizer=tokenizer) for a model already loaded.
    `drafter` and `gamma` are the defaults of every call.
    """

    def __init__(
        self,
        model=None,
        tokenizer=None,
        *,
        dtype: str = "auto",
        device: str = "cpu",
        name: str | None = None,
        drafter: str | Drafter = "none",
        gamma: int = 3,
    ) -> None:
        if isinstance(model, LoadedModel):
            verifier = model
        elif model is None or isinstance(model, str):
            if tokenizer is not None:
                raise UserError("a tokenizer goes with a loaded model: Engine(model=..., tokenizer=...)")
            verifier = load_model(model or DEFAULT_VERIFIER, dtype=dtype, device=device)
            name = name or model or DEFAULT_VERIFIER  # the name asked for, not where it resolved to
        else:
            if tokenizer is None:
                raise UserError("a loaded model needs its tokenizer: Engine(model=..., tokenizer=...)")
            label = name or getattr(model, "name_or_path", None) or type(model).__name__
            verifier = LoadedModel(model=model.eval(), tokenizer=tokenizer, name=str(label))
        if name:
            verifier = replace(verifier, name=name)
        self.verifier = verifier
        self.decoder = Decoder(verifier)
        self.default_drafter = drafter
        self.gamma = gamma
        self._drafters: dict[str, Drafter] = {}
        self._lock = threading.Lock()
        self._owner: int | None = None
        if isinstance(drafter, str):
            parse_drafter(drafter)

    # What the drafters' constructors read (`polyspec.drafters.NGram(model, engine)`).
    @property
    def model(self):
        return self.verifier.model

    @property
    def tokenizer(self):
        return self.verifier.tokenizer

    @property
    def name(self) -> str:
        return self.verifier.name

    @property
    def vocab_size(self) -> int:
        return self.verifier.vocab_size

    @property
    def max_length(self) -> int | None:
        """The verifier's context in tokens (prompt plus new tokens), if it has one."""
        return self.verifier.max_length

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def drafter(self, spec: str | Drafter | None = None) -> Drafter:
        """The drafter for a spec string, built on first use and kept; objects pass through."""
        spec = self.default_drafter if spec is None else spec
        if not isinstance(spec, str):
            size = getattr(spec, "vocab_size", None)
            if isinstance(size, int) and size != self.vocab_size:
                raise UserError(f"the drafter drafts over {size} tokens, the verifier over {self.vocab_size}")
            return spec
        if spec not in self._drafters:
            self._drafters[spec] = NoDrafter() if spec == "none" else make_drafter(spec, self.verifier)
        return self._drafters[spec]

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids as the verifier reads them (with its special tokens)."""
        return self.decoder.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_prompt(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of a chat (a list of {"role", "content"}) with the generation prompt, by
        the tokenizer's chat template; UserError where the tokenizer has none."""
        if not self.has_chat_template:
            raise UserError(f"model {self.name!r} has no chat template: send a plain prompt instead")
        try:
            text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # template errors (jinja raise_exception, bad roles) are the caller's
            raise UserError(f"the chat template rejected the messages: {str(exc).splitlines()[0]}") from exc
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise UserError("the chat encodes to no tokens")
        return ids

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.encode(prompt)
        ids = [int(i) for i in prompt]
        if not ids:
            raise UserError("the prompt is empty")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise UserError(f"prompt token ids must be in [0, {self.vocab_size}), got {min(ids)}..{max(ids)}")
        return ids

    def _prepare(
        self,
        prompt: str | Sequence[int],
        drafter: str | Drafter | None = None,
        *,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        penalty_window: int = 0,
        do_sample: bool | None = None,
        stop_strings: str | Sequence[str] = (),
        seed: int = 0,
        gamma: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
        sampling: SamplingConfig | None = None,
        tree: int = 0,
    ) -> _Steps:
        if sampling is None:
            sampling = sampling_config(temperature, top_k, top_p, repetition_penalty, penalty_window, do_sample)
        if isinstance(stop_strings, str):
            stop_strings = (stop_strings,)
        options = {
            "gamma": self.gamma if gamma is None else gamma,
            "sampling": sampling,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "eos_token_ids": None if eos_token_ids is None else frozenset(eos_token_ids),
        }
        if tree:
            options["tree"] = tree
        ids = self.prompt_ids(prompt)
        steps = _Steps(self.decoder, ids, self.drafter(drafter), stop_strings, options)
        steps.start()  # checks the arguments now; nothing runs until the first step
        steps.close()
        return steps

    def stream(self, prompt: str | Sequence[int], drafter: str | Drafter | None = None, **options) -> Stream:
        """The generation's text as it is accepted, without splitting characters and never past a
        stop string. Arguments are checked now; decoding starts with the first piece asked for.
        Takes the arguments of `generate`."""
        return Stream(self, self._prepare(prompt, drafter, **options))

    def generate(self, prompt: str | Sequence[int], drafter: str | Drafter | None = None, **options) -> Generation:
        """Generate from `prompt` (text, or token ids used as they are).

        drafter: a spec ('none', 'prompt-lookup', 'ngram:PATH+context', 'model:PATH', ...) or a
        drafter object; default the engine's. gamma: draft tokens per verifier call. Sampling:
        temperature (0: greedy), top_k (0: off), top_p (1: off), repetition_penalty (1: off),
        penalty_window (0: whole context), do_sample, seed; or a ready `sampling=SamplingConfig`.
        Stops: max_new_tokens, eos_token_ids (default the model's), stop_strings (the text ends
        just before the first; `token_ids` end with the token that completed it).
        """
        stream = self.stream(prompt, drafter, **options)
        for _ in stream.chunks():
            pass
        return stream.generation

    def _exclusive(self):
        engine = self

        class _Hold:
            def __enter__(self):
                me = threading.get_ident()
                if engine._owner == me:
                    raise UserError("this engine is already generating in this thread: finish or close that stream")
                engine._lock.acquire()
                engine._owner = me

            def __exit__(self, *exc):
                engine._owner = None
                engine._lock.release()

        return _Hold()


# -- transformers users -------------------------------------------------------------------------

# transformers' own defaults for what neither the call nor the model's generation config sets.
_DEFAULT_NEW_TOKENS = 20
_TRANSFORMERS_DEFAULTS = {
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.0,
}
_SUPPORTED = {
    "max_new_tokens",
    "max_length",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "stop_strings",
    "eos_token_id",
    "pad_token_id",
    "bos_token_id",
    "attention_mask",
    "use_cache",
    "tokenizer",
    "streamer",
}
_engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def engine_for(model, tokenizer) -> Engine:
    """The engine of an already loaded model and tokenizer, built once per model."""
    try:
        engine = _engines[model]
    except (KeyError, TypeError):
        engine = None
    if engine is None or engine.tokenizer is not tokenizer:
        engine = Engine(model=model, tokenizer=tokenizer)
        with contextlib.suppress(TypeError):  # a model that cannot be weakly referenced is not kept
            _engines[model] = engine
    return engine


def generate(
    model,
    tokenizer,
    inputs=None,
    drafter: str | Drafter = "prompt-lookup",
    *,
    gamma: int = 3,
    generation_config=None,
    seed: int | None = None,
    **kwargs,
):
    """Speculative `model.generate` for one sequence: takes the main arguments of
    `model.generate` (max_new_tokens / max_length, do_sample, temperature, top_k, top_p,
    repetition_penalty, stop_strings, eos_token_id, generation_config, streamer) with the same
    defaults (the call's, then the model's generation config, then transformers'), and returns
    what it returns: a [1, prompt + new] tensor of token ids. `inputs` is a [1, n] tensor, a
    list of ids, or a text (tokenized with `tokenizer`). Sampling draws from torch's global
    generator unless `seed` is given. Other `generate` arguments raise a UserError.
    """
    import torch

    if inputs is None:
        inputs = kwargs.pop("input_ids", None)
    unknown = sorted(set(kwargs) - _SUPPORTED)
    if unknown:
        raise UserError(f"polyspec.generate does not support {', '.join(unknown)}: use model.generate for those")
    ids = _input_ids(inputs, tokenizer, kwargs.pop("attention_mask", None))
    if kwargs.pop("use_cache", True) is False:
        raise UserError("speculative decoding needs the cache: use_cache=False is not supported")
    kwargs.pop("tokenizer", None)
    kwargs.pop("pad_token_id", None)
    kwargs.pop("bos_token_id", None)
    streamer = kwargs.pop("streamer", None)

    def setting(key):
        for source in (kwargs, vars(generation_config) if generation_config is not None else {}):
            value = source.get(key)
            if value is not None:
                return value
        value = getattr(model.generation_config, key, None)
        return _TRANSFORMERS_DEFAULTS.get(key) if value is None else value

    max_new = setting("max_new_tokens")
    if max_new is None and setting("max_length") is None:
        max_new = _DEFAULT_NEW_TOKENS  # as transformers: no length set anywhere means 20 new tokens
    elif max_new is None:
        max_new = setting("max_length") - len(ids)
        if max_new < 1:
            raise UserError(f"max_length {setting('max_length')} leaves no room after a prompt of {len(ids)} tokens")
    do_sample = bool(setting("do_sample"))
    sampling = SamplingConfig(
        temperature=float(setting("temperature")) if do_sample else 0.0,
        top_k=int(setting("top_k") or 0) if do_sample else 0,
        top_p=float(setting("top_p")) if do_sample else 1.0,
        repetition_penalty=float(setting("repetition_penalty")),
    )
    eos = setting("eos_token_id")
    eos_ids = None if eos is None else ([eos] if isinstance(eos, int) else [int(e) for e in eos])
    stops = setting("stop_strings") or ()
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item()) if do_sample else 0
    engine = engine_for(model, tokenizer)
    stream = engine.stream(
        ids,
        drafter,
        gamma=gamma,
        sampling=sampling,
        max_new_tokens=int(max_new),
        stop_strings=(stops,) if isinstance(stops, str) else tuple(stops),
        seed=seed,
        eos_token_ids=eos_ids,
    )
    if streamer is not None:
        streamer.put(torch.tensor([ids]))
    for chunk in stream.chunks():
        if streamer is not None and chunk.token_ids:
            streamer.put(torch.tensor(chunk.token_ids))
    if streamer is not None:
        streamer.end()
    device = next(model.parameters()).device
    return torch.tensor([ids + stream.generation.token_ids], dtype=torch.long, device=device)


def _input_ids(inputs, tokenizer, attention_mask) -> list[int]:
    import torch

    if isinstance(inputs, str):
        return tokenizer(inputs)["input_ids"]
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() == 2:
            if inputs.shape[0] != 1:
                raise UserError(f"polyspec.generate decodes one sequence at a time, got a batch of {inputs.shape[0]}")
            inputs = inputs[0]
        ids = inputs.tolist()
    elif inputs is None:
        raise UserError("give the prompt: input ids or a text")
    else:
        ids = [int(i) for i in inputs]
    if attention_mask is not None and not bool(torch.as_tensor(attention_mask).bool().all()):
        raise UserError("padded inputs are not supported: give the one sequence without padding")
    if not ids:
        raise UserError("the prompt is empty")
    return ids
