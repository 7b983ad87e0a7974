"""SFT warm start: next-token training on gold solutions — shipped with rlkit, cached, or trained here.

Every RL method starts from the same checkpoint: :func:`warm_start` loads the one rlkit ships (:data:`SHIPPED_DIR`),
else the cached one, else trains it on this CPU's float kernels (:mod:`rlkit.numerics`): AdamW, warm-up then cosine
decay to zero, one thread. The model learns to copy digits in a sharp transition (≈ 300–500 steps at d = 128); the
full schedule ends on a plateau, so the start hinges not on where it stopped.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlkit.environ import cache_origin, cache_root, check_dir, flag, writable_dir
from rlkit.errors import DamagedFile
from rlkit.numerics import cpu_model, weights_sha256
from rlkit.tasks import arithmetic
from rlkit.tiny.model import ARCHITECTURE, ModelConfig, TinyDecoder
from rlkit.tiny.task import (accuracy, build_tokenizer, evaluate, max_response_tokens, rollout, score_rollout,
                             sft_batch)
from rlkit.tiny.tokenizer import CharTokenizer


@dataclass
class SFTConfig:
    """Warm-start training: model shape, task, schedule."""

    d_model: int = 128  # Width of the decoder (128 × 4 layers ≈ 0.8M parameters learns the task in minutes).
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # Key/value heads shared by the query heads (None: one per head).
    max_len: int = 512  # Longest prompt + response.
    form: str = "mixed"
    """Solution form: "tool" (every step a calculator call), "plain" (the model does the arithmetic) or "mixed" (an
    optional plan in words, then each step one or the other: where the first call comes is the policy's choice)."""
    task: arithmetic.TaskConfig = field(default_factory=arithmetic.TaskConfig)  # Difficulty knobs of the problems.
    steps: int = 1000  # Optimizer steps: the whole cosine schedule, to a plateau (reproductions/LOG.md).
    schedule_steps: int | None = None  # Length of the cosine schedule (None: ``steps``; longer stops mid-schedule).
    batch_size: int = 32  # Fresh training problems per step.
    lr: float = 3e-3  # Peak learning rate.
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0  # Seeds the initialisation and the problem stream.
    eval_size: int = 200  # Held-out problems for the final greedy accuracy (stored with the checkpoint).

    def key(self, tokenizer: CharTokenizer) -> str:
        """Cache key: a hash of this config and the tokenizer's vocabulary."""
        blob = json.dumps({"sft": asdict(self), "tokenizer": tokenizer.to_dict(), "architecture": ARCHITECTURE},
                          sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    """``$RLKIT_CACHE/sft`` (default ``~/.cache/rlkit/sft``)."""
    return cache_root() / "sft"


def estimated_minutes(cfg: SFTConfig) -> float:
    """Roughly :func:`train`'s minutes on one x86 CPU thread (±2×), fitted to the cpu (16.3) and gpu (~85) scales."""
    return cfg.steps * (0.0126 + 1.75e-9 * cfg.batch_size * cfg.n_layers * cfg.d_model ** 2)


def roughly(minutes: float) -> str:
    """``minutes`` in words for an announcement: "under a minute", "about 16 min", "about 2.5 h"."""
    if minutes < 1:
        return "under a minute"
    if minutes < 90:
        return f"about {minutes:.0f} min"
    return f"about {minutes / 60:.1f} h"


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to 0 at ``schedule_steps`` (default ``steps``)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    horizon = cfg.schedule_steps or cfg.steps
    progress = (step - cfg.warmup) / max(1, horizon - cfg.warmup)
    return 0.5 * cfg.lr * (1.0 + math.cos(math.pi * min(1.0, progress)))


def next_token_loss(model: TinyDecoder, ids: torch.Tensor, target: torch.Tensor, pad_id: int,
                    rows_per_chunk: int = 8) -> torch.Tensor:
    """Mean cross-entropy over the ``target`` positions of right-padded ``ids`` (B, L), without the padding."""
    lengths = (ids != pad_id).sum(-1)
    total = torch.zeros((), device=ids.device)
    for rows in torch.argsort(lengths, stable=True).split(rows_per_chunk):
        n = int(lengths[rows].max())
        logits = model(ids[rows, : n - 1])
        wanted = target[rows, : n - 1]
        total = total + torch.nn.functional.cross_entropy(logits[wanted], ids[rows, 1:n][wanted], reduction="sum")
    return total / target.sum().clamp(min=1)


def sft_step(model: TinyDecoder, opt: torch.optim.Optimizer, tokenizer: CharTokenizer,
             problems: list[arithmetic.Problem], step: int, cfg: SFTConfig, device: str) -> float:
    """One optimizer step on ``problems``' gold solutions at ``step``'s learning rate; the loss."""
    ids, target = sft_batch(tokenizer, problems, cfg.form)
    ids, target = ids.to(device), target.to(device)
    loss = next_token_loss(model, ids, target, tokenizer.pad_id)
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return loss.item()


def train(cfg: SFTConfig, *, device: str = "cpu", progress: bool = True, curve: tuple[int, ...] = (),
          partial: Path | None = None) -> tuple[TinyDecoder, dict]:
    """A fresh model trained on gold solutions (one thread) and ``info``; checkpointed to, resumed from ``partial``."""
    if cfg.form not in arithmetic.FORMS:
        raise ValueError(f"unknown form {cfg.form!r}; valid: {', '.join(arithmetic.FORMS)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reductions split over threads round differently: one thread, one result per CPU
    try:
        return _train(cfg, device, progress, curve, partial or CHECKPOINTED_TO.get())
    finally:
        torch.set_num_threads(threads)


CHECKPOINTED_TO: contextvars.ContextVar[Path | None] = contextvars.ContextVar("sft_partial", default=None)
"""Where :func:`train` checkpoints without ``partial``: :func:`warm_start` sets it (:func:`partial_path`)."""
PARTIAL_EVERY_S = 60.0
"""Seconds between two checkpoints of an SFT training in progress (and one at Ctrl-C)."""


def _train(cfg: SFTConfig, device: str, progress: bool, curve: tuple[int, ...],
           partial: Path | None) -> tuple[TinyDecoder, dict]:
    tokenizer = build_tokenizer()
    torch.manual_seed(cfg.seed)
    model = TinyDecoder(model_config(cfg, tokenizer)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    stream = arithmetic.iter_split("train", cfg.seed, **asdict(cfg.task))
    first, loss_ema, along, before = load_partial(partial, model, opt)
    for _ in range(first * cfg.batch_size):  # the problems the finished steps drew, drawn again
        next(stream)
    start = saved_at = time.perf_counter()
    bar = tqdm(range(first, cfg.steps), desc="SFT", disable=not progress, leave=False, initial=first,
               total=cfg.steps)
    held_out = arithmetic.make_split(cfg.eval_size, "test", seed=0, **asdict(cfg.task))
    max_new = max_response_tokens(cfg.task, cfg.form)

    def save(done: int) -> None:
        minutes = before + (time.perf_counter() - start) / 60
        state = {"step": done, "loss_ema": loss_ema, "along": along, "minutes": minutes}
        save_partial(partial, model, opt, state)

    with _steps_end_before_ctrl_c() as interrupted:
        for step in bar:
            problems = [next(stream) for _ in range(cfg.batch_size)]
            loss = sft_step(model, opt, tokenizer, problems, step, cfg, device)
            loss_ema = loss if loss_ema is None else 0.95 * loss_ema + 0.05 * loss
            if step + 1 in curve and step + 1 < cfg.steps:  # greedy: no random number drawn, no weight moved
                along[step + 1] = accuracy(evaluate(model, tokenizer, held_out, max_new_tokens=max_new,
                                                    form=cfg.form))
            bar.set_postfix(loss=f"{loss_ema:.3f}")
            if partial is not None and (interrupted() or step + 1 == cfg.steps
                                        or time.perf_counter() - saved_at > PARTIAL_EVERY_S):
                save(step + 1)
                saved_at = time.perf_counter()
            if interrupted():
                raise KeyboardInterrupt
    model.eval()
    correct = evaluate(model, tokenizer, held_out, max_new_tokens=max_new, form=cfg.form)
    along[cfg.steps] = accuracy(correct)
    minutes = before + (time.perf_counter() - start) / 60
    info = {"loss": loss_ema, "val/acc": accuracy(correct), "minutes": minutes, "steps": cfg.steps,
            "curve": along if curve else {},
            "processor": cpu_model(), "fingerprint": fingerprint(),  # the machine that made these weights
            # per problem, with what produced it: an RL run's step-0 evaluation of the same problems reuses it
            "val/correct": correct.int().tolist(), "val/max_new_tokens": max_new, "val/device": str(device)}
    return model, info


def partial_path(path: Path) -> Path:
    """Where the training of the SFT start cached at ``path`` is checkpointed while it runs."""
    return path.with_name(f"partial-{path.name}")


def save_partial(path: Path | None, model: TinyDecoder, opt: torch.optim.Optimizer, state: dict) -> None:
    """An SFT training's checkpoint after ``state["step"]`` steps (weights, optimizer, ``state``), atomically."""
    from rlkit.files import atomic_write

    if path is None:
        return
    with atomic_write(path, "wb", fsync=False) as f:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), **state}, f)


def load_partial(path: Path | None, model: TinyDecoder,
                 opt: torch.optim.Optimizer) -> tuple[int, float | None, dict[int, float], float]:
    """Restore :func:`save_partial`'s checkpoint: ``(steps, loss EMA, curve, minutes)``; none or damaged: from 0."""
    from rlkit.files import read_torch

    if path is None or not path.exists():
        return 0, None, {}, 0.0
    try:
        blob = read_torch(path, ("model", "optimizer", "step", "loss_ema", "along", "minutes"))
        model.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optimizer"])
    except (DamagedFile, RuntimeError, ValueError, KeyError) as e:
        warnings.warn(f"the SFT training's checkpoint is damaged ({e}): training from its first step",
                      stacklevel=3)
        return 0, None, {}, 0.0
    return int(blob["step"]), blob["loss_ema"], dict(blob["along"]), float(blob["minutes"])


@contextlib.contextmanager
def _steps_end_before_ctrl_c() -> Iterator[Callable[[], bool]]:
    """Ctrl-C during a step lets the step end first; yields whether it came (main thread, default handler only)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield lambda: False
        return
    came: list[bool] = []
    previous = signal.signal(signal.SIGINT, lambda *_: came.append(True))
    try:
        yield lambda: bool(came)
    finally:
        signal.signal(signal.SIGINT, previous)


SHIPPED_DIR = Path(__file__).parent / "start"
"""The SFT starts (and SPO's offline passes) shipped with rlkit, with ``MANIFEST.json`` (weights SHA-256, maker)."""


def retrain_requested() -> bool:
    """``RLKIT_RETRAIN_SFT=1`` (``--retrain-sft``): train the SFT start here even where rlkit ships one."""
    return flag("RLKIT_RETRAIN_SFT")


def shipped_manifest() -> dict[str, dict]:
    """``MANIFEST.json`` of :data:`SHIPPED_DIR`: file name → its record (``sha256`` of the weights, how it was made)."""
    path = SHIPPED_DIR / "MANIFEST.json"
    return json.loads(path.read_text()) if path.exists() else {}


def load_checkpoint(path: Path, device: str, expected_sha256: str | None = None) -> tuple[TinyDecoder, dict]:
    """An SFT checkpoint as a model in eval mode and its ``info``; refused unless it hashes to ``expected_sha256``."""
    from rlkit.files import read_torch

    state = read_torch(path, ("model", "model_config", "info"))
    digest = weights_sha256(state["model"])
    if expected_sha256 is not None and digest != expected_sha256:
        raise RuntimeError(f"{path}: its weights hash to {digest[:12]}, not the {expected_sha256[:12]} that "
                           f"{path.parent / 'MANIFEST.json'} records: the file is damaged (a Git LFS pointer or a "
                           f"partial checkout?); restore it with `git checkout -- {path.name}` in that folder")
    model = TinyDecoder(ModelConfig.from_dict(state["model_config"]))
    model.load_state_dict(state["model"])
    model.to(device).eval()
    return model, {**state["info"], "sha256": digest, "path": str(path)}


def save_checkpoint(path: Path, model: TinyDecoder, info: dict, cfg: SFTConfig) -> None:
    """An SFT checkpoint (weights, model shape, ``info``, the SFT config) at ``path``, written atomically."""
    from rlkit.files import atomic_write, os_errors

    with os_errors():
        path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as f:  # two runs side by side may both write it
        torch.save({"model": model.state_dict(), "model_config": model.config.to_dict(), "info": info,
                    "sft_config": json.loads(json.dumps(asdict(cfg), default=list))}, f)


def warm_start(cfg: SFTConfig, *, device: str = "cpu", cache_dir: str | Path | None = None, progress: bool = True,
               retrain: bool | None = None) -> tuple[TinyDecoder, CharTokenizer, dict]:
    """The SFT checkpoint for ``cfg``: shipped (unless ``retrain``), else cached, else trained here and cached."""
    tokenizer = build_tokenizer()
    source, path = start_source(cfg, cache_dir=cache_dir, retrain=retrain)
    if source == "shipped":
        model, info = load_checkpoint(path, device, shipped_manifest().get(path.name, {}).get("sha256"))
        return model, tokenizer, {**info, "source": "shipped", "cached": True}
    if source == "cache":
        try:
            model, info = load_checkpoint(path, device)
            return model, tokenizer, {**info, "source": "cache", "cached": True}
        except DamagedFile as e:  # trained again, and the new file replaces it
            warnings.warn(f"the cached SFT start is damaged ({e}): training it again", stacklevel=2)
    if progress:
        why = "--retrain-sft" if (SHIPPED_DIR / path.name).exists() else "rlkit ships no start for this SFT config"
        where = (f"{roughly(estimated_minutes(cfg))} on one CPU thread" if device == "cpu"
                 else f"on {device} (the time estimate is for CPUs only)")
        kernels = "this CPU's float kernels (rlkit env)" if device == "cpu" else "this GPU's kernels"
        print(f"SFT start: training {cfg.steps:,} steps on this machine ({why}), {where} (progress below; Ctrl-C "
              f"stops it); its weights, and every number after them, depend on {kernels}", file=sys.stderr,
              flush=True)
    token = CHECKPOINTED_TO.set(partial_path(path))
    try:
        model, info = train(cfg, device=device, progress=progress)
    finally:
        CHECKPOINTED_TO.reset(token)
    save_checkpoint(path, model, info, cfg)
    partial_path(path).unlink(missing_ok=True)
    return model, tokenizer, {**info, "source": "trained", "cached": False, "path": str(path),
                              "sha256": weights_sha256(model.state_dict())}


def start_source(cfg: SFTConfig, *, cache_dir: str | Path | None = None,
                 retrain: bool | None = None) -> tuple[str, Path]:
    """Where :func:`warm_start` takes ``cfg``'s start: (``shipped``/``cache``/``trained``, file), the cache checked."""
    name = f"sft-{cfg.key(build_tokenizer())}.pt"
    retrain = retrain_requested() if retrain is None else retrain
    if (SHIPPED_DIR / name).exists() and not retrain:
        return "shipped", SHIPPED_DIR / name
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    origin = cache_origin(cache_dir)
    check_dir(folder, origin)
    if (folder / name).exists():
        return "cache", folder / name
    return "trained", writable_dir(folder, origin, checkpoint_bytes(cfg)) / name


def model_config(cfg: SFTConfig, tokenizer: CharTokenizer) -> ModelConfig:
    return ModelConfig(vocab_size=tokenizer.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                       n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, max_len=cfg.max_len)


def checkpoint_bytes(cfg: SFTConfig) -> int:
    """About the size of ``cfg``'s SFT checkpoint file: float32 weights and a megabyte for the rest."""
    with torch.device("meta"):
        model = TinyDecoder(model_config(cfg, build_tokenizer()))
    return 4 * sum(t.numel() for t in model.state_dict().values()) + (1 << 20)


FINGERPRINT_STEPS = 4
"""SFT steps the fingerprint takes (about a second on one core)."""


@functools.lru_cache(maxsize=None)
def fingerprint(steps: int = FINGERPRINT_STEPS) -> str:
    """A hash of the cpu-scale model after ``steps`` SFT steps from a fixed start: equal where kernels agree."""
    threads = torch.get_num_threads()
    rng = torch.random.get_rng_state()
    torch.set_num_threads(1)
    try:
        cfg, tokenizer = SFTConfig(), build_tokenizer()
        torch.manual_seed(0)
        model = TinyDecoder(model_config(cfg, tokenizer))
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        stream = arithmetic.iter_split("train", 0, **asdict(cfg.task))
        for step in range(steps):
            sft_step(model, opt, tokenizer, [next(stream) for _ in range(cfg.batch_size)], step, cfg, "cpu")
        return weights_sha256(model.state_dict())[:12]
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)


def offline_scores(run: Any, gen: torch.Generator, n: int, *, sft: dict | None = None,
                   cache_dir: str | Path | None = None) -> dict[int, list[float]]:
    """``n`` scored samples per pool prompt of ``run`` (a :class:`rlkit.tiny.step.Run`) from its SFT start; with
    ``sft``, looked up by all the pass reads (``gen``'s state after too) in :data:`SHIPPED_DIR`, then ``cache_dir``."""
    from rlkit.files import atomic_write, read_torch

    if n == 0:
        return {}
    path = None
    if sft is not None:
        key = hashlib.sha256(json.dumps({
            "sft": sft["sha256"], "pool": [asdict(p) for p in run.pool], "n": n, "temperature": run.cfg.temperature,
            "max_new": run.max_new, "form": run.form,
            "gen": hashlib.sha256(gen.get_state().numpy().tobytes()).hexdigest(),
        }, sort_keys=True, default=str).encode()).hexdigest()[:16]
        name = f"offline-{key}.pt"
        path = Path(cache_dir or default_cache_dir()) / name
        for found in (SHIPPED_DIR / name, path):  # the module's, read now: a test may point it elsewhere
            if not found.exists():
                continue
            try:
                saved = read_torch(found, ("scores", "gen_after"))
            except DamagedFile as e:
                if found != path:  # a shipped file is part of the package: refused, never replaced
                    raise
                print(f"rlkit: {e}; sampling the offline pass again", file=sys.stderr)
                break
            gen.set_state(saved["gen_after"])
            return {i: row.tolist() for i, row in enumerate(saved["scores"])}
    problems = [p for p in run.pool for _ in range(n)]
    rewards = []
    for i in range(0, len(problems), 512):
        chunk = problems[i : i + 512]
        ro = rollout(run.model, run.tokenizer, chunk, max_new_tokens=run.max_new, form=run.form,
                     temperature=run.cfg.temperature, generator=gen)
        rewards.append(score_rollout(ro, chunk).rewards)
    per_prompt = torch.cat(rewards).view(len(run.pool), n)
    if path is not None:  # written atomically: two runs of one seed side by side may both write it
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, "wb") as f:
            torch.save({"scores": per_prompt.cpu(), "gen_after": gen.get_state()}, f)
    return {i: per_prompt[i].tolist() for i in range(len(run.pool))}
