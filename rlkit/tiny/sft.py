"""SFT warm start: next-token training on gold solutions, cached on disk by a hash of its config.

Every RL method starts from the same checkpoint: :func:`warm_start` trains once per configuration and later
calls (other methods, other seeds of the RL stage, the notebooks) load the file. The cache key hashes the SFT
config, the model shape, the task knobs and the tokenizer, so changing any of them trains a new model.

Schedule (as measured when this engine was built): AdamW, linear warm-up then cosine decay, a batch of fresh training problems each
step; training may stop before the schedule ends (``schedule_steps``). The model learns to copy digits in a sharp transition (≈ 300–500 steps at d = 128); stopping where
held-out accuracy is ≈ 55–70% leaves RL room to improve.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rlkit.tasks import arithmetic
from rlkit.tiny.model import ARCHITECTURE, ModelConfig, TinyDecoder
from rlkit.tiny.task import accuracy, build_tokenizer, evaluate, max_response_tokens, sft_batch
from rlkit.tiny.tokenizer import CharTokenizer


@dataclass
class SFTConfig:
    """Warm-start training: model shape, task, schedule."""

    d_model: int = 128
    """Width of the decoder (NOTES: 128 × 4 layers ≈ 0.8M parameters learns the task in minutes on a CPU)."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads."""
    n_kv_heads: int | None = None
    """Key/value heads shared by the query heads (None: one per head). 1 cuts the sampler's KV-cache reads 4×."""
    max_len: int = 512
    """Longest prompt + response."""
    form: str = "mixed"
    """Solution form: "tool" (every step a calculator call; learns fast), "plain" (the model does the
    arithmetic) or "mixed" (an optional plan in words, then each step one or the other: where the first call comes
    is the policy's choice)."""
    task: arithmetic.TaskConfig = field(default_factory=arithmetic.TaskConfig)
    """Difficulty knobs of the generated problems."""
    steps: int = 750
    """Optimizer steps. Measured here (d = 128, tool form): held-out accuracy 15% at 600, 48% at 700, 63% at
    800 steps of a 1000-step schedule; 750 stops inside the copy transition. The mixed form starts near 15%: its
    plain steps are usually miscomputed, and RL learns to call the calculator instead (reproductions/LOG.md)."""
    schedule_steps: int | None = 1000
    """Length of the cosine schedule (None: ``steps``); longer than ``steps`` stops training mid-schedule."""
    batch_size: int = 32
    """Fresh training problems per step."""
    lr: float = 3e-3
    """Peak learning rate."""
    warmup: int = 50
    """Linear warm-up steps."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    seed: int = 0
    """Seeds the initialisation and the problem stream."""
    eval_size: int = 200
    """Held-out problems for the final greedy accuracy (stored with the checkpoint)."""

    def key(self, tokenizer: CharTokenizer) -> str:
        """Cache key: a hash of this config and the tokenizer's vocabulary."""
        blob = json.dumps({"sft": asdict(self), "tokenizer": tokenizer.to_dict(), "architecture": ARCHITECTURE},
                          sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    """``$RLKIT_CACHE/sft`` (default ``~/.cache/rlkit/sft``)."""
    return Path(os.environ.get("RLKIT_CACHE", "~/.cache/rlkit")).expanduser() / "sft"


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to 0 at ``schedule_steps`` (default ``steps``)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    horizon = cfg.schedule_steps or cfg.steps
    progress = (step - cfg.warmup) / max(1, horizon - cfg.warmup)
    return 0.5 * cfg.lr * (1.0 + math.cos(math.pi * min(1.0, progress)))


def next_token_loss(model: TinyDecoder, ids: torch.Tensor, target: torch.Tensor, pad_id: int,
                    rows_per_chunk: int = 8) -> torch.Tensor:
    """Mean cross-entropy over the ``target`` positions of right-padded ``ids`` (B, L) (see ``sft_batch``).

    Rows of similar length go through the model together, each chunk cut to its longest row: the same loss as one
    padded batch (causal attention never reaches right padding), without computing the padding (about half of a
    batch of word problems)."""
    lengths = (ids != pad_id).sum(-1)
    total = torch.zeros((), device=ids.device)
    for rows in torch.argsort(lengths, stable=True).split(rows_per_chunk):
        n = int(lengths[rows].max())
        logits = model(ids[rows, : n - 1])
        wanted = target[rows, : n - 1]
        total = total + torch.nn.functional.cross_entropy(logits[wanted], ids[rows, 1:n][wanted], reduction="sum")
    return total / target.sum().clamp(min=1)


def train(cfg: SFTConfig, *, device: str = "cpu", progress: bool = True) -> tuple[TinyDecoder, dict]:
    """Train a fresh model on gold solutions; returns the model and ``info`` (loss, accuracy, minutes)."""
    if cfg.form not in arithmetic.FORMS:
        raise ValueError(f"unknown form {cfg.form!r}; valid: {', '.join(arithmetic.FORMS)}")
    tokenizer = build_tokenizer()
    torch.manual_seed(cfg.seed)
    model = TinyDecoder(ModelConfig(vocab_size=tokenizer.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                                    n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, max_len=cfg.max_len)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    stream = arithmetic.iter_split("train", cfg.seed, **asdict(cfg.task))
    start, loss_ema = time.perf_counter(), None
    bar = tqdm(range(cfg.steps), desc="SFT", disable=not progress, leave=False)
    for step in bar:
        ids, target = sft_batch(tokenizer, [next(stream) for _ in range(cfg.batch_size)], cfg.form)
        ids, target = ids.to(device), target.to(device)
        loss = next_token_loss(model, ids, target, tokenizer.pad_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{loss_ema:.3f}")
    model.eval()
    held_out = arithmetic.make_split(cfg.eval_size, "test", seed=0, **asdict(cfg.task))
    max_new = max_response_tokens(cfg.task, cfg.form)
    correct = evaluate(model, tokenizer, held_out, max_new_tokens=max_new, form=cfg.form)
    info = {"loss": loss_ema, "val/acc": accuracy(correct), "minutes": (time.perf_counter() - start) / 60,
            "steps": cfg.steps,
            # per problem, with what produced it: an RL run's step-0 evaluation of the same problems reuses it
            "val/correct": correct.int().tolist(), "val/max_new_tokens": max_new, "val/device": str(device)}
    return model, info


def warm_start(
    cfg: SFTConfig, *, device: str = "cpu", cache_dir: str | Path | None = None, progress: bool = True
) -> tuple[TinyDecoder, CharTokenizer, dict]:
    """The SFT checkpoint for ``cfg``: loaded from the cache, or trained and cached (written atomically)."""
    tokenizer = build_tokenizer()
    path = Path(cache_dir or default_cache_dir()) / f"sft-{cfg.key(tokenizer)}.pt"
    if path.exists():
        state = torch.load(path, map_location=device, weights_only=True)
        model = TinyDecoder(ModelConfig.from_dict(state["model_config"])).to(device)
        model.load_state_dict(state["model"])
        model.eval()
        return model, tokenizer, {**state["info"], "cached": True, "path": str(path)}
    model, info = train(cfg, device=device, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"model": model.state_dict(), "model_config": model.config.to_dict(), "info": info,
                "sft_config": json.loads(json.dumps(asdict(cfg), default=list))}, tmp)
    os.replace(tmp, path)
    return model, tokenizer, {**info, "cached": False, "path": str(path)}
