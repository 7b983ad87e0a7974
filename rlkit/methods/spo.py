"""SPO — Single-stream Policy Optimization.

Xu & Ding (Tencent), *Single-stream Policy Optimization*, arXiv 2509.13232 (ICLR 2026); reference code:
the verl recipe ``recipe/spo/spo_ray_trainer.py`` (commit 4b2b364). One response per prompt, no groups.
A per-prompt Beta tracker (α, β) supplies the baseline:

    v̂(x) = α/(α+β)                          the PRE-update value, independent of the current sample
    A = r − v̂(x),   Ã = (A − μ_B)/(σ_B + ε)   normalised over the whole batch (σ: unbiased std)
    α ← ρα + r,   β ← ρβ + (1 − r)           after the policy step
    ρ = clip(2^(−D/D_half), ρ_min, ρ_max)    KL-adaptive forgetting; D = mean_t |log π_prev − log π_cur|
    α₀ = N₀(Σs + ½)/(N + 1),  β₀ = N₀(N − Σs + ½)/(N + 1),  N₀ = 1/(1 − ρ_min)   offline init
    w(x) = √(v̂(1 − v̂)) / N_eff^γ + ε         prompt sampling weight (N_eff = α + β)

Ã is broadcast to every token and trained with the PPO clipped surrogate
(:func:`rlkit.methods.grpo.ppo_clip_loss` with clip 0.2/0.28, dual clip c = 10, token-mean).

With N_eff = α + β the Beta update is the adaptive EMA v̂ ← v̂ + η(r − v̂), η = 1/(ρ·N_eff + 1),
N_eff ← ρ·N_eff + 1. That identity holds for any r ∈ [0, 1], so non-binary rewards (``binary=False``) use the
same arithmetic: it *is* the paper's EMA on v̂; α, β then lose their success-count reading.

Deviations (each a choice where the paper or the verl code leaves a gap, or where verl has a quirk):

- D is verl's mean |Δlogp| over the response last sampled for the prompt (the paper says KL). D_half (0.06)
  and ρ_max (0.96) are parameters here; verl hard-codes both. The constant schedule is the recipe's
  ``rho.type: constant`` with ``rho.value`` (not clipped, as in verl).
- A prompt drawn several times in one batch gets ONE forgetting step and all its observations:
  α ← ρα + Σr, β ← ρβ + Σ(1 − r), ρ from the mean D of its samples (the Beta posterior of a batch from one
  policy). verl overwrites the prompt's state once per sample, so only the last sample's update survives.
- Offline init uses N = the number of scores actually given (capped at ``offline_N``, taking the FIRST
  ones); verl draws a random subset and divides by ``offline_N`` even when fewer scores exist. A prompt with
  no offline scores starts at α = β = ½ (verl raises KeyError).
- ``spo_advantage`` of one sample is 0 (the centred advantage is 0; torch's unbiased std would give NaN).
- The prompt sampler uses its own seeded ``torch.Generator`` (resumable) instead of numpy's global RNG; its
  default ``replacement="auto"`` is verl's rule (draw without replacement unless the pool is too small).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch

from rlkit.core.ops import check_shapes, group_sum, masked_mean
from rlkit.hooks import Hooks, StepBatch, draw, side_generator
from rlkit.registry import (
    AdvantageInputs, Method, OfflinePass, VerlKey, kwargs_for, register_advantage, register_method,
)
from rlkit.settings import DualClipKnobs, knob

Tensor = torch.Tensor

RHO_TYPES = ("kl", "constant")


@dataclass
class Config(DualClipKnobs):
    """SPO hyperparameters (verl recipe ``spo_trainer.yaml`` / ``train.sh``; the paper's where they agree): its own
    advantage, and the PPO clip with the recipe's ε_low 0.2 and token-mean loss (``loss_agg_mode``), as
    :mod:`rlkit.registry` declares them."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"rho_type": RHO_TYPES}
    """The values each choice field may take (checked by :func:`rlkit.registry.check_settings`)."""

    rho_type: str = "kl"
    """Forgetting schedule (recipe ``rho.type``): "kl" = clip(2^(−D/D_half), ρ_min, ρ_max) or "constant"."""
    rho_value: float | None = knob(None, gt=0, le=1)
    """The constant ρ when rho_type is "constant" (recipe ``rho.value``; no default, it must be set)."""
    rho_min: float = knob(0.875, gt=0, lt=1)
    """ρ_min, the lower clip of ρ (recipe ``rho.clip_lower``); also sets N₀ = 1/(1 − ρ_min) = 8."""
    rho_max: float = knob(0.96, gt=0, le=1)
    """ρ_max, the upper clip of ρ (hard-coded in verl); a prompt seen for the first time has D = 0 → ρ_max."""
    d_half: float = knob(0.06, gt=0)
    """D_half: the divergence at which 2^(−D/D_half) halves (hard-coded in verl)."""
    offline_N: int = knob(8, ge=0)
    """Offline scores per prompt behind α₀, β₀ (recipe ``offline_N``); 0 starts every prompt at α = β = ½."""
    eps: float = knob(0.05, ge=0)
    """ε added to the sampling weight √(v̂(1 − v̂)) so no prompt is starved."""
    gamma: float = knob(0.0, ge=0, le=1)
    """γ in the weight's N_eff^γ divisor (paper, γ ∈ [0, 1]); verl uses 0."""
    adv_eps: float = knob(1e-8, ge=0)
    """Added to the batch std in the advantage normalisation."""
    no_baseline: bool = False
    """Ablation (recipe ``no_baseline``, paper App. F): v̂ = 0, i.e. trainers pass zero baselines."""
    binary: bool = True
    """Rewards are 0 or 1 (the paper's Beta posterior; another reward is refused); False: any reward in [0, 1], as
    a partial-credit rule gives (e.g. GSM8K's format score), tracked by the same update read as an adaptive moving
    average (module doc)."""
    clip_high: float = 0.28
    """ε_high of the PPO clip (recipe, clip-higher)."""
    clip_c: float | None = 10.0
    """Dual-clip constant for negative advantages (recipe ``clip_ratio_c``)."""


# --------------------------------------------------------------------------- forgetting factor ρ


def _check_rho_params(
    rho_min: float, rho_max: float, d_half: float, rho_type: str, rho_value: float | None
) -> None:
    if rho_type not in RHO_TYPES:
        raise ValueError(f"unknown rho_type {rho_type!r}; valid: {', '.join(RHO_TYPES)}")
    if not 0.0 < rho_min < 1.0:
        raise ValueError(f"rho_min must be in (0, 1) (N₀ = 1/(1 − rho_min) is finite); got {rho_min}")
    if not rho_min <= rho_max <= 1.0:
        raise ValueError(f"need rho_min ≤ rho_max ≤ 1 (ρ is a forgetting factor); got {rho_min}, {rho_max}")
    if not d_half > 0.0:
        raise ValueError(f"d_half must be > 0 (the divergence at which ρ halves); got {d_half}")
    if rho_type == "constant" and (rho_value is None or not 0.0 < rho_value <= 1.0):
        raise ValueError(f"rho_type='constant' needs rho_value in (0, 1] (recipe rho.value); got {rho_value}")


def _rho_unclipped(divergence: Tensor, d_half: float) -> Tensor:
    return torch.exp2(-divergence / d_half)  # 2^(−D/D_half)


def _as_divergence(divergence: Any) -> Tensor:
    d = torch.as_tensor(divergence).detach()
    d = d if d.is_floating_point() else d.double()
    if torch.isnan(d).any() or (d < 0).any():
        raise ValueError(f"divergence must be ≥ 0 (a mean |Δlogp|), not NaN; got min {d.min().item()}")
    return d


def spo_rho(
    divergence: Tensor,
    *,
    rho_min: float = 0.875,
    rho_max: float = 0.96,
    d_half: float = 0.06,
    rho_type: str = "kl",
    rho_value: float | None = None,
) -> Tensor:
    """Forgetting factor ρ, shaped like ``divergence`` D: clip(2^(−D/d_half), rho_min, rho_max) or rho_value.

    D = 0 gives rho_max; D = d_half gives ½ (clipped up to rho_min by default); D = +inf gives rho_min.
    """
    _check_rho_params(rho_min, rho_max, d_half, rho_type, rho_value)
    d = _as_divergence(divergence)
    if rho_type == "constant":
        return torch.full_like(d, rho_value)
    return _rho_unclipped(d, d_half).clamp(rho_min, rho_max)


def spo_divergence(logp_prev: Tensor, logp_cur: Tensor, mask: Tensor) -> Tensor:
    """D = mean over valid tokens of |log π_prev − log π_cur| → ``(B,)`` (verl's KL proxy; 0 if no token).

    All three are ``(B, T)``: the log-probs of the response last sampled for each prompt, under the policy
    that sampled it and under the current one. The result is detached: D only sets ρ.
    """
    check_shapes(mask, logp_prev=logp_prev, logp_cur=logp_cur)
    return masked_mean((logp_prev.detach() - logp_cur.detach()).abs(), mask, dim=-1)


# --------------------------------------------------------------------------- prompt ids


def _as_1d(ids: Any, what: str) -> Any:
    if isinstance(ids, Tensor):
        ids = ids.detach().cpu().numpy()
    if isinstance(ids, np.ndarray) and ids.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {ids.shape}")
    return ids


def _id_values(ids: Any, what: str) -> pd.Index:
    """A batch of ids as an object Index for hash lookups (tuples stay single ids; no per-id Python)."""
    ids = _as_1d(ids, what)
    return pd.Index(ids if isinstance(ids, np.ndarray) else list(ids), dtype=object, tupleize_cols=False)


def _pool_ids(ids: Any, what: str) -> list:
    """A pool of unique ids as plain Python objects (numpy scalars unwrapped: state loads weights_only)."""
    ids = _as_1d(ids, what)
    ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    ids = [i.item() if isinstance(i, np.generic) else i for i in ids]  # object arrays may hold np.str_
    index = pd.Index(ids, dtype=object, tupleize_cols=False)
    if not index.is_unique:
        repeated = index[index.duplicated()].unique().tolist()[:5]
        raise ValueError(f"prompt ids must be unique; repeated: {repeated}")
    return ids


# --------------------------------------------------------------------------- value tracker


class ValueTracker:
    """Per-prompt Beta tracker (α, β) over a fixed pool of prompt ids (module doc for the equations).

    ``prompt_ids``: the pool (any hashable, unique; tensors/numpy arrays accepted). α, β are float64 CPU
    tensors ``(P,)`` in pool order. Batches of ids are mapped to pool positions with one pandas hash lookup;
    everything after that is index/scatter arithmetic.

    ``offline_scores``: a mapping prompt id → sequence of offline scores (verl's ``offline_values.json``, a
    dict from prompt to a list). With ``binary`` they are binarised with (s > 0) (verl's offline pass scores
    ±1); otherwise they must lie in [0, 1]. The first ``offline_N`` scores are used (None: all; 0: none).
    Prompts with no scores start at α = β = ½. Ids in the mapping that are not in the pool are ignored, but a
    mapping that matches no pool id at all raises (a key mismatch, e.g. unstripped prompt text).

    ``binary``: rewards must be exactly 0 or 1 (the Beta posterior); ``binary=False`` accepts r ∈ [0, 1] and
    the same update is the EMA on v̂. In both modes v̂ stays in (0, 1) (in float64 it can round to 1 only
    after hundreds of consecutive successes at ρ_min).
    """

    def __init__(
        self,
        prompt_ids: Any,
        *,
        offline_scores: Mapping[Any, Any] | None = None,
        offline_N: int | None = None,
        rho_min: float = 0.875,
        rho_max: float = 0.96,
        d_half: float = 0.06,
        rho_type: str = "kl",
        rho_value: float | None = None,
        binary: bool = True,
    ) -> None:
        _check_rho_params(rho_min, rho_max, d_half, rho_type, rho_value)
        if offline_N is not None and offline_N < 0:
            raise ValueError(f"offline_N must be ≥ 0 or None (all scores); got {offline_N}")
        self.rho_min, self.rho_max, self.d_half = rho_min, rho_max, d_half
        self.rho_type, self.rho_value, self.binary = rho_type, rho_value, binary
        self._set_ids(_pool_ids(prompt_ids, "prompt_ids"))
        self.alpha = torch.full((len(self),), 0.5, dtype=torch.float64)
        self.beta = torch.full((len(self),), 0.5, dtype=torch.float64)
        if offline_scores is not None and offline_N != 0:
            self._init_offline(offline_scores, offline_N)

    def _set_ids(self, ids: list) -> None:
        self.prompt_ids = ids
        self._index = pd.Index(ids, dtype=object, tupleize_cols=False)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def _init_offline(self, offline_scores: Mapping[Any, Any], offline_N: int | None) -> None:
        keys = _id_values(list(offline_scores.keys()), "offline_scores keys")
        pos = self._index.get_indexer(keys)
        if len(keys) and (pos < 0).all():
            raise ValueError(f"no offline_scores key is a prompt id (first: {keys[0]!r}); check the format")
        lists = [torch.as_tensor(v, dtype=torch.float64) for v in offline_scores.values()]
        if any(s.dim() != 1 for s in lists):  # a bare number would silently count as one score
            raise ValueError("offline_scores must map each prompt id to a 1-D sequence of scores")
        counts = torch.tensor([len(s) for s in lists], dtype=torch.long)
        scores = torch.cat(lists) if lists else torch.zeros(0, dtype=torch.float64)
        if not torch.isfinite(scores).all():
            raise ValueError("offline scores must be finite numbers")
        if self.binary:
            scores = (scores > 0).double()  # verl: int(score > 0)
        elif ((scores < 0) | (scores > 1)).any():
            raise ValueError("with binary=False offline scores must lie in [0, 1]")
        owner = torch.repeat_interleave(torch.arange(len(keys)), counts)  # which key each score belongs to
        rank = torch.arange(len(scores)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        keep = rank < (offline_N if offline_N is not None else len(scores) + 1)  # the first offline_N
        s_sum = group_sum(scores[keep], owner[keep], len(keys))
        n = group_sum(torch.ones_like(scores[keep]), owner[keep], len(keys))
        use = torch.as_tensor(pos >= 0) & (n > 0)  # in the pool, with at least one score
        n0 = 1.0 / (1.0 - self.rho_min)  # the equilibrium N_eff of ρ = ρ_min
        target = torch.as_tensor(pos)[use]
        self.alpha[target] = n0 * (s_sum[use] + 0.5) / (n[use] + 1.0)
        self.beta[target] = n0 * (n[use] - s_sum[use] + 0.5) / (n[use] + 1.0)

    def _lookup(self, ids: Any) -> Tensor:
        if ids is None:
            return torch.arange(len(self))
        query = _id_values(ids, "ids")
        pos = self._index.get_indexer(query)
        if (pos < 0).any():
            unknown = query[pos < 0]
            raise KeyError(f"{len(unknown)} id(s) not in the tracker's prompt pool: {unknown[:5].tolist()}")
        return torch.as_tensor(pos, dtype=torch.long)

    def baseline(self, ids: Any = None) -> Tensor:
        """v̂ = α/(α+β) per id ``(B,)`` (None: the whole pool, in pool order). Call it BEFORE ``update``."""
        idx = self._lookup(ids)
        return self.alpha[idx] / (self.alpha[idx] + self.beta[idx])

    def weights(self, ids: Any = None, *, eps: float = 0.05, gamma: float = 0.0) -> Tensor:
        """Sampling weights √(v̂(1 − v̂)) / N_eff^γ + eps ``(B,)`` (None: the pool, for the sampler)."""
        if eps < 0 or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"need eps ≥ 0 and gamma in [0, 1]; got eps={eps}, gamma={gamma}")
        idx = self._lookup(ids)
        n_eff = self.alpha[idx] + self.beta[idx]
        p = self.alpha[idx] / n_eff
        return (p * (1.0 - p)).sqrt() / n_eff**gamma + eps

    def update(self, ids: Any, rewards: Any, divergence: Any = None) -> dict[str, float]:
        """Fold a batch into the tracker: α ← ρα + Σr, β ← ρβ + Σ(1 − r) per prompt (module doc, duplicates).

        ``rewards`` ``(B,)`` (0/1, or [0, 1] when ``binary=False``); ``divergence`` ``(B,)`` D ≥ 0 per
        sample (:func:`spo_divergence`; 0 for a prompt seen for the first time), needed for rho_type "kl",
        ignored for "constant". Returns verl's metrics ``spo/D``, ``spo/rho_clipped``, ``spo/rho_clip_ratio``.
        """
        idx = self._lookup(ids)
        r = torch.as_tensor(rewards, dtype=torch.float64).detach().cpu()
        if r.shape != idx.shape:
            raise ValueError(f"rewards must be ({len(idx)},), one per id; got shape {tuple(r.shape)}")
        if self.binary and not ((r == 0) | (r == 1)).all():
            raise ValueError("binary tracker: rewards must be 0 or 1 (e.g. (score > 0).float()); "
                             "use binary=False for rewards in [0, 1]")
        if not ((r >= 0) & (r <= 1)).all():
            raise ValueError("rewards must lie in [0, 1] (rescale them: v̂ estimates a success rate)")
        if divergence is None:
            if self.rho_type == "kl":
                raise ValueError("rho_type='kl' needs the divergence D per sample (spo_divergence; 0 if new)")
            divergence = torch.zeros_like(r)
        d = _as_divergence(divergence).to(torch.float64).cpu()
        if d.shape != idx.shape:
            raise ValueError(f"divergence must be ({len(idx)},), one per id; got shape {tuple(d.shape)}")
        prompts, inv = torch.unique(idx, return_inverse=True)  # each prompt once, for one forgetting step
        count = group_sum(torch.ones_like(r), inv, len(prompts))
        d_mean = group_sum(d, inv, len(prompts)) / count
        rho = spo_rho(d_mean, rho_min=self.rho_min, rho_max=self.rho_max, d_half=self.d_half,
                      rho_type=self.rho_type, rho_value=self.rho_value)
        r_sum = group_sum(r, inv, len(prompts))
        self.alpha[prompts] = rho * self.alpha[prompts] + r_sum
        self.beta[prompts] = rho * self.beta[prompts] + (count - r_sum)
        if self.rho_type == "kl":
            raw = _rho_unclipped(d_mean, self.d_half)
            clipped = ((raw < self.rho_min) | (raw > self.rho_max)).double()[inv]
        else:
            clipped = torch.zeros_like(r)
        return {
            "spo/D": d.mean().item(),
            "spo/rho_clipped": rho[inv].mean().item(),
            "spo/rho_clip_ratio": clipped.mean().item(),
        }

    # ----------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: ids (in order), α, β and the ρ settings."""
        return {
            "prompt_ids": list(self.prompt_ids),
            "alpha": self.alpha.clone(),
            "beta": self.beta.clone(),
            "config": {"rho_min": self.rho_min, "rho_max": self.rho_max, "d_half": self.d_half,
                       "rho_type": self.rho_type, "rho_value": self.rho_value, "binary": self.binary},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (pool, α, β and ρ settings all come from ``state``)."""
        ids = _pool_ids(state["prompt_ids"], "prompt_ids")
        alpha, beta = state["alpha"], state["beta"]
        for name, t in (("alpha", alpha), ("beta", beta)):
            if not isinstance(t, Tensor) or t.dtype != torch.float64 or t.shape != (len(ids),):
                raise ValueError(f"state {name} must be a float64 tensor of shape ({len(ids)},)")
            if not (t > 0).all():
                raise ValueError(f"state {name} must be > 0")
        cfg = dict(state["config"])
        _check_rho_params(cfg["rho_min"], cfg["rho_max"], cfg["d_half"], cfg["rho_type"], cfg["rho_value"])
        self._set_ids(ids)
        self.alpha, self.beta = alpha.detach().clone().cpu(), beta.detach().clone().cpu()
        self.rho_min, self.rho_max, self.d_half = cfg["rho_min"], cfg["rho_max"], cfg["d_half"]
        self.rho_type, self.rho_value, self.binary = cfg["rho_type"], cfg["rho_value"], cfg["binary"]

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to ``path`` atomically (temp file in the same directory, then ``os.replace``)."""
        path = os.fspath(path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".spo-tracker-")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(self.state_dict(), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> ValueTracker:
        """A tracker restored from :meth:`save` (``torch.load(weights_only=True)``: no pickled code runs)."""
        state = torch.load(os.fspath(path), weights_only=True)
        tracker = cls(state["prompt_ids"], **state["config"])
        tracker.load_state_dict(state)
        return tracker


# --------------------------------------------------------------------------- prompt sampler


class PromptSampler:
    """Weighted prompt draws over a fixed pool, seeded and resumable.

    ``replacement``: True, False (raises when n exceeds the prompts with positive weight) or "auto" (verl:
    without replacement unless n exceeds them). Draws use ``torch.multinomial`` with the sampler's own
    ``torch.Generator``; ``state_dict``/``load_state_dict`` restore it exactly, so a resumed run (same torch
    version) draws the same prompts. Pools are limited to 2^24 prompts (``torch.multinomial``).
    """

    def __init__(self, prompt_ids: Any, *, replacement: bool | str = "auto", seed: int = 0) -> None:
        if not (isinstance(replacement, bool) or replacement == "auto"):
            raise ValueError(f"replacement must be True, False or 'auto'; got {replacement!r}")
        ids = _pool_ids(prompt_ids, "prompt_ids")
        if not ids:
            raise ValueError("the prompt pool is empty")
        self._ids = pd.Index(ids, dtype=object, tupleize_cols=False)
        self.replacement, self.seed = replacement, seed
        self._generator = torch.Generator().manual_seed(seed)

    @property
    def prompt_ids(self) -> list:
        return self._ids.tolist()

    def sample(self, weights: Any, n: int) -> list:
        """Draw ``n`` prompt ids with probability ∝ ``weights`` ``(P,)`` in pool order (tracker.weights())."""
        w = torch.as_tensor(weights, dtype=torch.float64).detach().cpu()
        if w.shape != (len(self._ids),):
            raise ValueError(f"weights must be ({len(self._ids)},), one per pool id; got {tuple(w.shape)}")
        if not torch.isfinite(w).all() or (w < 0).any():
            raise ValueError("weights must be finite and ≥ 0")
        positive = int((w > 0).sum())
        if positive == 0:
            raise ValueError("all weights are 0: nothing can be drawn")
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive int; got {n!r}")
        replace = n > positive if self.replacement == "auto" else self.replacement
        if not replace and n > positive:
            raise ValueError(
                f"cannot draw {n} prompts without replacement from {positive} with positive weight; "
                "use replacement=True or 'auto'"
            )
        idx = torch.multinomial(w, n, replacement=replace, generator=self._generator)
        return self._ids.take(idx.numpy()).tolist()

    def state_dict(self) -> dict[str, Any]:
        """Pool, replacement rule, seed and the generator's exact state."""
        return {"prompt_ids": self.prompt_ids, "replacement": self.replacement, "seed": self.seed,
                "generator": self._generator.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the pool must be the same (same ids, same order)."""
        if list(state["prompt_ids"]) != self.prompt_ids:
            raise ValueError("the saved sampler has a different prompt pool (ids or order differ)")
        self.replacement, self.seed = state["replacement"], state["seed"]
        self._generator.set_state(state["generator"])


# --------------------------------------------------------------------------- advantage


def spo_advantage(
    rewards: Tensor, baselines: Tensor, *, adv_eps: float = 1e-8, mask: Tensor | None = None
) -> Tensor:
    """Ã = (A − mean A)/(std A + adv_eps) with A = r − v̂, over the whole batch; std unbiased (verl).

    ``rewards`` and ``baselines`` are ``(B,)`` (``baselines`` from :meth:`ValueTracker.baseline`, taken
    before the update). Returns ``(B,)``, or ``(B, T)`` broadcast over ``mask`` when one is given, in the
    rewards' floating dtype. B = 1 gives 0 (the centred advantage); an all-equal batch gives 0.
    """
    r = torch.as_tensor(rewards).detach()
    b = torch.as_tensor(baselines).detach().to(r.device)
    if r.dim() != 1 or b.shape != r.shape or r.numel() == 0:
        raise ValueError(
            f"rewards and baselines must be (B,) with B ≥ 1; got {tuple(r.shape)} and {tuple(b.shape)}"
        )
    if adv_eps < 0:
        raise ValueError(f"adv_eps must be ≥ 0; got {adv_eps}")
    out_dtype = r.dtype if r.is_floating_point() else torch.get_default_dtype()
    adv = r.double() - b.double()  # float64: the tracker's baselines are float64
    if adv.numel() == 1:
        adv = torch.zeros_like(adv)
    else:
        adv = (adv - adv.mean()) / (adv.std() + adv_eps)
    adv = adv.to(out_dtype)
    if mask is None:
        return adv
    check_shapes(mask)
    if mask.shape[0] != adv.shape[0]:
        raise ValueError(f"mask has {mask.shape[0]} rows for {adv.shape[0]} rewards")
    return adv.unsqueeze(-1) * mask.to(adv.dtype)


@register_advantage("spo", method="spo")
def spo_estimator(inputs: AdvantageInputs, *, adv_eps: float = 1e-8, no_baseline: bool = False) -> Tensor:
    """SPO's advantage of a batch (:func:`spo_advantage`) against the tracker's pre-update v̂ → ``(B, T)``.

    ``inputs.baselines`` are the v̂ (:meth:`ValueTracker.baseline`); ``no_baseline`` (the paper's App. F ablation)
    uses v̂ = 0 and needs none."""
    if no_baseline:
        baselines = torch.zeros_like(torch.as_tensor(inputs.rewards), dtype=torch.float64)
    else:
        inputs.require("spo", "baselines")
        baselines = inputs.baselines
    return spo_advantage(inputs.rewards, baselines, adv_eps=adv_eps, mask=inputs.mask)


# --------------------------------------------------------------------------- SPO in a run (both engines)


class SpoHooks(Hooks):
    """SPO's part in a run, the same in both engines: the tracker and sampler over the pool (initialised from the
    start policy's offline scores), the prompts drawn by weight, the tracker's pre-update v̂ as baselines, D from
    each prompt's last response, and the tracker's update after the policy step.

    Metrics: ``spo/sampling_focus`` (mean p̂(1 − p̂) of the drawn prompts over the pool's, 1: no focus),
    ``spo/sampling_focus_uniform`` (the same for a uniform draw of as many prompts, from a generator of its own),
    ``spo/weight_cv`` (how unequal the weights were), and the tracker's ρ and D.
    """

    grouped = False  # one response per prompt: no groups
    keyed = True  # a tracker value and a kept response per prompt

    def start(self, engine: Any, *, resumed: bool) -> None:
        # a resumed run restores the tracker instead of re-estimating the offline values
        offline = None if resumed or self.config.offline_N == 0 else engine.offline_scores(self.config.offline_N)
        self.seed, self.pool = engine.seed, list(engine.pool_ids)
        self.tracker = ValueTracker(self.pool, offline_scores=offline, **kwargs_for(ValueTracker, self.config))
        self.sampler = PromptSampler(self.pool, seed=engine.seed)
        self.weights: Tensor | None = None
        self.divergence: Tensor | None = None

    def choose_prompts(self, n: int, step: int) -> list:
        self.weights = self.tracker.weights(**kwargs_for(ValueTracker.weights, self.config))
        return self.sampler.sample(self.weights, n)

    def advantage_inputs(self, batch: StepBatch, engine: Any) -> dict[str, Any]:
        # D of each prompt's last response sets its forgetting factor ρ (0 for a prompt not seen before)
        recalled = engine.recall(batch.prompt_ids)
        self.divergence = torch.zeros(len(batch.prompt_ids), dtype=torch.float64)
        for j, pid in enumerate(batch.prompt_ids):
            if pid in recalled:
                r = recalled[pid]
                self.divergence[j] = spo_divergence(r.logp_then[None], r.logp_now[None], r.mask[None])[0].item()
        return {"baselines": self.tracker.baseline(batch.prompt_ids).to(batch.rewards)}

    def advantage_metrics(self, adv: Tensor, inputs: AdvantageInputs, batch: StepBatch) -> dict[str, float]:
        uniform = draw(len(self.pool), len(batch.prompt_ids), side_generator(self.seed, batch.step,
                                                                               "spo-uniform-draw"))
        weights = self.weights  # the draw's; a batch these hooks did not draw (a test's): the tracker's now
        if weights is None:
            weights = self.tracker.weights(**kwargs_for(ValueTracker.weights, self.config))
        w = weights.double().detach().cpu()
        mean = w.mean().item()
        return {"spo/sampling_focus": self._focus(batch.prompt_ids),
                "spo/sampling_focus_uniform": self._focus([self.pool[i] for i in uniform.tolist()]),
                "spo/weight_cv": w.std(correction=0).item() / mean if mean > 0 else float("nan")}

    def _focus(self, ids: list) -> float:
        """Mean p̂(1 − p̂) of ``ids`` over its mean across the pool (1: no concentration near p̂ = 1/2)."""
        drawn, pool = self.tracker.baseline(ids).double(), self.tracker.baseline(self.pool).double()
        base = (pool * (1 - pool)).mean().item()
        return (drawn * (1 - drawn)).mean().item() / base if base > 0 else float("nan")

    def after_update(self, batch: StepBatch, engine: Any) -> dict[str, float]:
        tracked = self.tracker.update(batch.prompt_ids, batch.rewards.double(), self.divergence)
        engine.remember(batch, {pid: row for row, pid in enumerate(batch.prompt_ids)})  # a prompt's last row
        return {"spo/rho/mean": tracked["spo/rho_clipped"], "spo/D/mean": tracked["spo/D"],
                "spo/rho_clip_ratio": tracked["spo/rho_clip_ratio"],
                "spo/rho_free_frac": 1.0 - tracked["spo/rho_clip_ratio"]}  # ρ inside its window: ρ acts

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict(), "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.tracker.load_state_dict(state["tracker"])
        self.sampler.load_state_dict(state["sampler"])


# D_half 0.25 in the tiny engine instead of verl's hard-coded 0.06, matched to the tiny model's divergences:
# revisited prompts have D ≈ 0.02–0.05 there, and at 0.06 their ρ sat at ρ_min for ~75% of prompts (ρ only acts
# for D in [0.059, 0.193]·D_half).
register_method(Method("spo", Config, advantage="spo", policy_loss="ppo", hooks=SpoHooks,
                       engine_defaults={"d_half": 0.25},
                       # the start policy's offline_N scores per prompt; a verl run reads them from offline_values.json
                       offline_pass=OfflinePass(samples="offline_N", verl_key="offline_values"),
                       verl_keys={"offline_values": VerlKey(file=True)},
                       logs=frozenset({"spo/rho/mean", "spo/D/mean", "spo/rho_clip_ratio", "spo/rho_free_frac",
                                       "spo/sampling_focus", "spo/sampling_focus_uniform", "spo/weight_cv"})))
