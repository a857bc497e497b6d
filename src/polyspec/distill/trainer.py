"""Distilling the verifier into a drafter cut from it, with `accelerate`.

The same code runs on one CPU, one GPU, or many GPUs and nodes under `accelerate launch`: each
process takes its own slice of every global batch, gradients are averaged by the wrapped model.
Only the drafter's layers, final norm and reduced head train; its input embeddings (and a full
head tied to them) stay the verifier's, so they can be shared with it at decoding time.

Batches are a pure function of (seed, step): epoch e visits the examples in the order of a
permutation seeded by (seed, e), so `--resume` continues exactly where a run stopped.
Checkpoints hold only what trains (weights, optimizer and schedule state), under OUT.train/.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from polyspec.distill import data as teacher
from polyspec.distill.build import column_ids, decoder_body, output_logits
from polyspec.distill.losses import LOSSES, Target, distill_loss, top1_agreement
from polyspec.drafters.reduced_head import reduced_head
from polyspec.errors import UserError
from polyspec.files import write_atomic

MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
# Options that change neither the batches nor the updates: a run may resume with others.
NOT_FINGERPRINTED = ("out", "cache_dir", "save_every", "keep", "teacher_batch", "device")


@dataclass(frozen=True)
class TrainConfig:
    verifier: str
    drafter: str
    out: str
    data: teacher.DataOptions
    loss: str = "fkl"
    on_policy: bool = False
    steps: int = 150
    batch_size: int = 8  # sequences per process and step
    lr: float = 1e-4
    warmup: int = 20
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    teacher_dtype: str = "auto"
    mixed_precision: str = "auto"  # bf16 where the hardware computes in it natively
    device: str = "auto"
    save_every: int = 50
    keep: int = 2  # checkpoints kept
    cache_dir: str | None = None  # None: verifier outputs are not cached
    teacher_batch: int = 8

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise UserError(f"unknown loss {self.loss!r}: use {', '.join(LOSSES)}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise UserError(f"mixed precision must be one of {', '.join(MIXED_PRECISION)}")
        for name in ("steps", "batch_size", "save_every", "keep", "teacher_batch"):
            if getattr(self, name) < 1:
                raise UserError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise UserError(f"learning rate must be > 0, got {self.lr}")
        if self.warmup < 0:
            raise UserError(f"warmup must be >= 0, got {self.warmup}")

    @property
    def state_dir(self) -> Path:
        out = Path(self.out)
        return out.with_name(out.name + ".train")

    def fingerprint(self) -> dict:
        fields = asdict(self)
        for name in NOT_FINGERPRINTED:
            fields.pop(name)
        return fields


@dataclass
class TrainReport:
    out: str
    steps: int
    processes: int
    examples: int
    cache: str | None
    cache_hit: bool
    data_seconds: float
    train_seconds: float
    seconds_per_step: float
    loss_first: float
    loss_last: float
    top1_first: float
    top1_last: float
    eval_loss: tuple[float, float]  # over all training examples, before and after (NaN: not evaluated)
    eval_top1: tuple[float, float]
    history: list[dict] = field(default_factory=list, repr=False)
    main: bool = True  # the process that reports (the others stay quiet)

    def to_dict(self) -> dict:
        fields = asdict(self)
        fields.pop("history")
        fields.pop("main")
        return fields


class DraftOutputs(nn.Module):
    """The drafter as the training step needs it: logits over its own columns at the trained
    positions only ([N, D]: a full-vocabulary row per token of a long batch would not fit)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask, rows, cols) -> torch.Tensor:
        hidden = decoder_body(self.lm)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return output_logits(self.lm, hidden.last_hidden_state[rows, cols])


def freeze_embeddings(model: nn.Module) -> list[nn.Parameter]:
    """Train everything but the input embeddings and a full-vocabulary head; returns what trains."""
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    model.get_input_embeddings().weight.requires_grad_(False)
    if reduced_head(model) is None:
        model.get_output_embeddings().weight.requires_grad_(False)
    return [p for p in model.parameters() if p.requires_grad]


def resolve_precision(name: str, device: str) -> str:
    """'auto': bf16 autocast on GPUs that support it and on CPUs with native bf16, else none
    (master weights stay float32 either way)."""
    if name != "auto":
        return name
    from polyspec.models import cpu_has_native_bf16

    if device != "cpu" and torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return "bf16" if cpu_has_native_bf16() else "no"


def warmup_cosine(warmup: int, steps: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def batch_indices(step: int, rank: int, processes: int, batch: int, examples: int, seed: int) -> list[int]:
    """This process's examples at `step`: a slice of the global batch of the epoch order."""
    begin = (step * processes + rank) * batch
    indices = []
    for position in range(begin, begin + batch):
        epoch, within = divmod(position, examples)
        indices.append(int(_epoch_order(examples, seed, epoch)[within]))
    return indices


@lru_cache(maxsize=4)
def _epoch_order(examples: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(examples, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def id_to_column(columns: torch.Tensor | None, vocab: int, device) -> torch.Tensor:
    """[vocab] drafter column of each verifier id, -1 for ids the drafter cannot emit."""
    index = torch.full((vocab,), -1, dtype=torch.long, device=device)
    if columns is None:
        return torch.arange(vocab, device=device)
    index[columns.to(device)] = torch.arange(columns.numel(), device=device)
    return index


class Trainer:
    def __init__(self, config: TrainConfig, show_progress: bool = True) -> None:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        from polyspec.drafters.distilled import check_verifier, load_drafter, read_meta
        from polyspec.models import resolve_device
        from polyspec.specs import load_model

        self.config = config
        self.show_progress = show_progress
        if config.device != "auto":
            resolve_device(config.device)  # a clear error for CUDA asked for but absent
        precision = resolve_precision(config.mixed_precision, config.device)
        self.accelerator = Accelerator(cpu=config.device == "cpu", mixed_precision=precision)
        set_seed(config.seed)
        device = self.accelerator.device
        self.meta = read_meta(config.drafter)
        self.verifier = load_model(config.verifier, dtype=config.teacher_dtype, device=str(device))
        check_verifier(self.meta, self.verifier, config.drafter)
        self.drafter = load_drafter(config.drafter, torch.float32, str(device))
        tokenizer = self.verifier.tokenizer
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.columns = column_ids(self.drafter)
        self.to_column = id_to_column(self.columns, self.verifier.vocab_size, device)
        self.trainable = freeze_embeddings(self.drafter)
        self.drafter.train()
        optimizer = torch.optim.AdamW(self.trainable, lr=config.lr, weight_decay=config.weight_decay)
        # Stepped here once per step (a prepared scheduler would step once per process).
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(config.warmup, config.steps))
        self.module, self.optimizer = self.accelerator.prepare(DraftOutputs(self.drafter), optimizer)

    # ------------------------------------------------------------ data

    def teacher_data(self) -> tuple[teacher.TeacherData, Path | None, bool]:
        options = self.config.data
        if self.config.on_policy:
            options = replace(options, prompts_only=True)
        cache = Path(self.config.cache_dir) if self.config.cache_dir else None
        acc = self.accelerator
        result = None
        if acc.is_main_process or cache is None:
            with self._progress() as progress:
                units = teacher.work_units(self.verifier, options)
                task = progress.add_task("verifier outputs", total=units or None, stats="")
                advance = lambda n: progress.advance(task, n)  # noqa: E731
                result = teacher.cached(self.verifier, options, cache, self.config.teacher_batch, advance)
        acc.wait_for_everyone()
        if result is None:  # other processes read what the main one wrote
            result = teacher.cached(self.verifier, options, cache, self.config.teacher_batch)
        return result

    def batch(self, data: teacher.TeacherData, picked: list[int], step: int, on_policy: bool):
        """Sequences, starts, targets and the verifier's top-1 ids for the examples `picked`."""
        acc, config = self.accelerator, self.config
        sequences = [data.sequences[i] for i in picked]
        starts = [data.starts[i] for i in picked]
        if on_policy:
            prompts = [data.sequences[i][: data.prompt_lengths[i]] for i in picked]
            new = max(len(data.sequences[i]) - data.prompt_lengths[i] for i in picked)
            if config.data.kind == "translation":
                new = config.data.max_new_tokens
            torch.manual_seed(config.seed * 1_000_003 + step * acc.num_processes + acc.process_index)
            self.drafter.eval()
            continuations, _ = teacher.continue_batch(
                self.drafter, prompts, max(1, new), self.pad, {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, 0
            )
            self.drafter.train()
            sequences = [list(p) + c for p, c in zip(prompts, continuations, strict=True)]
            starts = [len(p) - 1 for p in prompts]
        if data.target_ids is not None and not on_policy:
            ids = torch.cat([data.target_ids[i] for i in picked]).to(acc.device).long()
            logprobs = torch.cat([data.target_logprobs[i] for i in picked]).to(acc.device)
            return sequences, starts, Target(logprobs, self.to_column[ids]), ids[:, 0]
        scored = teacher.score(self.verifier.model, sequences, starts, config.data.top_k, self.pad)
        if config.data.top_k:
            ids, logprobs = scored[0].long(), scored[1]
            return sequences, starts, Target(logprobs, self.to_column[ids]), ids[:, 0]
        dense = scored if self.columns is None else scored[:, self.columns]
        return sequences, starts, Target(dense.float()), scored.argmax(dim=-1)

    # ------------------------------------------------------------ steps

    def forward(self, sequences, starts) -> torch.Tensor:
        acc = self.accelerator
        ids, mask = teacher.pack(sequences, self.pad, acc.device)
        rows, cols = teacher.trained_positions(sequences, starts)
        with acc.autocast():
            return self.module(ids, mask, rows.to(acc.device), cols.to(acc.device)).float()

    def step(self, data: teacher.TeacherData, step: int) -> tuple[float, float]:
        acc, config = self.accelerator, self.config
        picked = batch_indices(step, acc.process_index, acc.num_processes, config.batch_size, len(data), config.seed)
        sequences, starts, target, top1 = self.batch(data, picked, step, config.on_policy)
        logits = self.forward(sequences, starts)
        loss = distill_loss(config.loss, logits, target)
        acc.backward(loss)
        if self.config.max_grad_norm:
            acc.clip_grad_norm_(self.trainable, self.config.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        agreement = top1_agreement(logits.detach(), self.columns, top1)
        stats = torch.tensor([loss.detach().float().item(), agreement], device=acc.device)
        stats = acc.reduce(stats, reduction="mean")
        return float(stats[0]), float(stats[1])

    @torch.no_grad()
    def evaluate(self, data: teacher.TeacherData) -> tuple[float, float]:
        """Loss and top-1 agreement over every example, on the verifier's own sequences (for
        on-policy data, which are prompts only, NaN)."""
        if self.config.on_policy:
            return math.nan, math.nan
        self.drafter.eval()
        total_loss = total_top1 = weight = 0.0
        for begin in range(0, len(data), self.config.batch_size):
            picked = list(range(begin, min(begin + self.config.batch_size, len(data))))
            sequences, starts, target, top1 = self.batch(data, picked, 0, on_policy=False)
            logits = self.forward(sequences, starts)
            rows = top1.numel()
            total_loss += float(distill_loss(self.config.loss, logits, target)) * rows
            total_top1 += top1_agreement(logits, self.columns, top1) * rows
            weight += rows
        self.drafter.train()
        return total_loss / weight, total_top1 / weight

    def run(self, resume: bool = False, keep_checkpoints: bool = False, evaluate: bool = False) -> TrainReport:
        acc, config = self.accelerator, self.config
        began = time.perf_counter()
        data, cache, hit = self.teacher_data()
        if not len(data):
            raise UserError("no training examples")
        data_seconds = time.perf_counter() - began
        first = self.resume() if resume else self._fresh()
        before = self.evaluate(data) if evaluate else (math.nan, math.nan)
        history: list[dict] = []
        smooth_loss = smooth_top1 = None
        trained = time.perf_counter()
        with self._progress() as progress:
            task = progress.add_task("distill", total=config.steps, completed=first, stats="")
            for step in range(first, config.steps):
                clock = time.perf_counter()
                loss, top1 = self.step(data, step)
                seconds = time.perf_counter() - clock
                smooth_loss = loss if smooth_loss is None else 0.9 * smooth_loss + 0.1 * loss
                smooth_top1 = top1 if smooth_top1 is None else 0.9 * smooth_top1 + 0.1 * top1
                record = {"step": step + 1, "loss": loss, "top1": top1, "lr": self.scheduler.get_last_lr()[0]}
                record["seconds"] = seconds
                history.append(record)
                self._log(record)
                progress.update(task, advance=1, stats=f"loss {smooth_loss:.4f}  top-1 {smooth_top1:.3f}")
                if (step + 1) % config.save_every == 0 or step + 1 == config.steps:
                    self.save_checkpoint(step + 1)
        train_seconds = time.perf_counter() - trained
        after = self.evaluate(data) if evaluate else (math.nan, math.nan)
        acc.wait_for_everyone()
        if acc.is_main_process:
            self.export(history, cache)
            if not keep_checkpoints:
                # The drafter holds all that is needed now; checkpoints weigh 3x its trainable part.
                log = config.state_dir / "log.jsonl"
                if log.is_file():
                    shutil.copy2(log, Path(config.out) / "training-log.jsonl")
                shutil.rmtree(config.state_dir, ignore_errors=True)
        acc.wait_for_everyone()
        done = len(history)
        head, tail = history[: min(10, done)], history[-min(10, done) :] if done else []
        return TrainReport(
            out=config.out,
            steps=config.steps,
            processes=acc.num_processes,
            examples=len(data),
            cache=str(cache) if cache else None,
            cache_hit=hit,
            data_seconds=data_seconds,
            train_seconds=train_seconds,
            seconds_per_step=train_seconds / done if done else 0.0,
            loss_first=_mean(head, "loss"),
            loss_last=_mean(tail, "loss"),
            top1_first=_mean(head, "top1"),
            top1_last=_mean(tail, "top1"),
            eval_loss=(before[0], after[0]),
            eval_top1=(before[1], after[1]),
            history=history,
            main=acc.is_main_process,
        )

    # ------------------------------------------------------------ checkpoints

    def _fresh(self) -> int:
        root = self.config.state_dir
        if (root / "latest.json").is_file():
            raise UserError(f"{root} holds checkpoints of an earlier run: pass --resume to continue it or remove it")
        if self.accelerator.is_main_process:
            (root / "log.jsonl").unlink(missing_ok=True)  # of a run stopped before its first checkpoint
        return 0

    def save_checkpoint(self, step: int) -> None:
        from safetensors.torch import save_file

        acc = self.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            root = self.config.state_dir
            name = f"step-{step:06d}"
            tmp = root / f".{name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            weights = {n: p.detach().cpu().contiguous() for n, p in self.drafter.named_parameters() if p.requires_grad}
            save_file(weights, str(tmp / "trainable.safetensors"))
            state = {
                "step": step,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "fingerprint": json.dumps(self.config.fingerprint(), sort_keys=True),
            }
            torch.save(state, tmp / "state.pt")
            final = root / name
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            write_atomic(root / "latest.json", json.dumps({"step": step, "checkpoint": name}))
            for old in sorted(root.glob("step-*"))[: -self.config.keep]:
                shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()

    def resume(self) -> int:
        """Load the latest checkpoint; returns the number of steps it had done."""
        from safetensors.torch import load_file

        root = self.config.state_dir
        try:
            latest = json.loads((root / "latest.json").read_text(encoding="utf-8"))
            directory = root / latest["checkpoint"]
            state = torch.load(directory / "state.pt", map_location="cpu", weights_only=True)
            weights = load_file(str(directory / "trainable.safetensors"))
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"nothing to resume in {root}: {exc.__class__.__name__}") from exc
        if state["fingerprint"] != json.dumps(self.config.fingerprint(), sort_keys=True):
            raise UserError(f"the checkpoint in {root} was made with other options: resume with the same ones")
        names = {n for n, p in self.drafter.named_parameters() if p.requires_grad}
        if set(weights) != names:
            raise UserError(f"the checkpoint in {directory} does not fit this drafter")
        with torch.no_grad():
            for name, parameter in self.drafter.named_parameters():
                if name in weights:
                    parameter.copy_(weights[name].to(parameter.device))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        return int(state["step"])

    def export(self, history: list[dict], cache: Path | None) -> None:
        from polyspec.distill.checkpoint import save_drafter

        config = self.config
        entry = {
            **{k: v for k, v in config.fingerprint().items() if k != "drafter"},
            "from": config.drafter,
            "cache": str(cache) if cache else None,
            "loss_last": _mean(history[-10:], "loss"),
            "top1_last": _mean(history[-10:], "top1"),
        }
        meta = replace(self.meta, training=[*self.meta.training, entry])
        self.drafter.eval()
        save_drafter(self.accelerator.unwrap_model(self.module).lm, self.verifier.tokenizer, meta, Path(config.out))

    # ------------------------------------------------------------ output

    def _log(self, record: dict) -> None:
        if self.accelerator.is_main_process:
            self.config.state_dir.mkdir(parents=True, exist_ok=True)
            with open(self.config.state_dir / "log.jsonl", "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")

    def _progress(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = [
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
        ]
        visible = self.show_progress and self.accelerator.is_main_process
        return Progress(*columns, disable=not visible, transient=False)


def _mean(records: list[dict], key: str) -> float:
    return sum(r[key] for r in records) / len(records) if records else math.nan


def train(
    config: TrainConfig,
    resume: bool = False,
    show_progress: bool = True,
    keep_checkpoints: bool = False,
    evaluate: bool = False,
) -> TrainReport:
    return Trainer(config, show_progress).run(resume, keep_checkpoints, evaluate)
