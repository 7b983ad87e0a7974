"""DAPO — Decoupled Clip and Dynamic sAmpling Policy Optimization.

Yu et al. (ByteDance Seed, Tsinghua AIR), *DAPO: An Open-Source LLM Reinforcement Learning System at Scale*,
arXiv 2503.14476; reference code: verl's ``recipe/dapo``. GRPO's group advantage (the paper's Eq. 10, as
:func:`rlkit.methods.grpo.grpo_advantage`) trained with four changes (§3), no KL term (§2.3) and no dual clip:

    J_DAPO(θ) = E[ 1/Σ_i|o_i| · Σ_i Σ_t min(r_{i,t}·Â_{i,t}, clip(r_{i,t}, 1 − ε_low, 1 + ε_high)·Â_{i,t}) ]   (Eq. 8)
                s.t. 0 < |{o_i : o_i is correct}| < G

1. **Clip-higher** (§3.1): ε_low = 0.2, ε_high = 0.28, so that low-probability tokens can grow (against entropy
   collapse, Fig. 2).
2. **Dynamic sampling** (§3.2, Eq. 11, the constraint of Eq. 8): a group whose rewards are all equal has advantage 0
   and gives no gradient; such groups are dropped and the batch is refilled with groups that have signal. Here:
   ``oversample`` × the wanted groups are sampled and the first ``prompts_per_step`` with unequal correctness kept
   (:class:`DapoHooks`, on the scored rewards, before any shaping); metrics ``dapo/groups_dropped`` (all-equal
   groups among those sampled), ``dapo/extra_samples`` (responses sampled beyond the batch) and
   ``train/kept_groups``.
3. **Token-level policy-gradient loss** (§3.3, Eq. 12): every token of the batch weighs the same (``agg =
   token-mean``, Eq. 8's 1/Σ_i|o_i|), where GRPO's per-response mean lets a long response's tokens weigh less.
4. **Overlong reward shaping** (§3.4, Eq. 13): with the budget L_max and the buffer L_cache, a response longer than
   L_max − L_cache loses reward linearly, ((L_max − L_cache) − |y|)/L_cache, down to −1 at L_max (here scaled by
   ``overlong_penalty``, verl's ``penalty_factor``); metric ``dapo/overlong_frac``, the share of responses it
   reached.

The paper's run (§4.1): Qwen2.5-32B base, 512 prompts × 16 responses per step, mini-batches of 512 responses (16
updates per step), AdamW at 1e-6 with 20 warm-up steps, L_max 16,384 + L_cache 4,096; AIME 2024 avg@32 of 50
(Table 1's ablation: naive GRPO 30, + overlong filtering 36, + clip-higher 38, + soft overlong punishment 41,
+ token-level loss 42, + dynamic sampling 50).

Deviations:

- The paper refills by sampling further batches until the batch is full; here the extra groups are sampled up front
  (``oversample`` ×), and when fewer than wanted have signal the batch is smaller (with none, the first groups are
  kept: their advantage is 0).
- The paper's reward is ±1 (correct / not, §2.4); the tiny engine's is 1/0. The group advantage does not see the
  difference, but the overlong penalty (at most −``overlong_penalty``) is then half the reward's range, not a
  quarter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlkit.hooks import Hooks
from rlkit.registry import Method, register_method
from rlkit.settings import DualClipKnobs, GroupKnobs, knob

Tensor = torch.Tensor


@dataclass
class Config(GroupKnobs, DualClipKnobs):
    """DAPO hyperparameters (paper §4.1 / verl's ``recipe/dapo``): GRPO's group advantage and PPO clip with ε_low
    0.2 (§3.1), no dual clip (not part of DAPO) and the token-level loss ``token-mean`` (§3.3, Eq. 12: every
    token of the batch weighs the same), as :mod:`rlkit.registry` declares them; clip-higher and the rest here."""

    clip_high: float = 0.28
    """ε_high, clip-higher (§3.1)."""
    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal and refill the batch (§3.2, Eq. 11)."""
    oversample: int = knob(2, gt=0)
    """Groups sampled per wanted group when ``dynamic_sampling`` is on."""
    overlong_buffer: int = knob(4096, ge=0)
    """L_cache: the last this-many tokens of the response budget cost reward linearly (§3.4, Eq. 13; 0: off)."""
    overlong_penalty: float = knob(1.0, ge=0)
    """Reward lost at the very end of the budget (Eq. 13's 1; verl's ``penalty_factor``)."""


def overlong_penalty(lengths: Tensor, budget: int, *, overlong_buffer: int = 4096,
                     overlong_penalty: float = 1.0) -> Tensor:
    """Eq. 13's soft penalty ``(B,)``: 0 up to L_max − L_cache tokens, then linear down to −``overlong_penalty``
    at L_max = ``budget`` (and beyond it)."""
    if overlong_buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    over = lengths.float() - (budget - overlong_buffer)
    return -overlong_penalty * (over / overlong_buffer).clamp(0.0, 1.0)


def groups_with_signal(rewards: Tensor, group_size: int, wanted: int) -> tuple[Tensor, int, int]:
    """Eq. 11: rows of the first ``wanted`` groups whose rewards are not all equal → ``(rows, kept, dropped)``
    (``dropped``: all-equal groups among all given). With none, the first ``wanted`` groups (advantage 0)."""
    grouped = rewards.view(-1, group_size)
    signal = grouped.max(-1).values > grouped.min(-1).values
    mixed = signal.nonzero().squeeze(-1)[:wanted]
    if mixed.numel() == 0:  # nothing to learn from: keep the first groups (their advantage is 0)
        mixed = torch.arange(min(wanted, grouped.shape[0]))
    rows = (mixed.unsqueeze(-1) * group_size + torch.arange(group_size)).flatten()
    return rows, int(mixed.numel()), int((~signal).sum())


class DapoHooks(Hooks):
    """DAPO's dynamic sampling (§3.2) and overlong shaping (§3.4) in a run."""

    def __init__(self, config: Any, configs: Any) -> None:
        super().__init__(config, configs)
        self._overlong_frac = float("nan")
        """The share of the step's responses the overlong penalty reached (set by :meth:`shape_rewards`, logged by
        :meth:`advantage_metrics`: ``shape_rewards`` returns the rewards only)."""

    def check(self, settings: Any) -> None:
        budget = getattr(settings, "max_new_tokens", None)
        if budget is not None and self.config.overlong_buffer > budget:
            raise ValueError(f"dapo.overlong_buffer ({self.config.overlong_buffer}) exceeds the response budget "
                             f"max_new_tokens ({budget}): every response would lose reward (Eq. 13 needs "
                             "L_cache ≤ L_max)")

    def groups_to_draw(self, n: int) -> int:
        return n * self.config.oversample if self.config.dynamic_sampling else n

    def keep_groups(self, rewards: Tensor, group_size: int, wanted: int) -> tuple[Tensor | None, dict[str, float]]:
        if not self.config.dynamic_sampling:
            return None, {}
        rows, kept, dropped = groups_with_signal(rewards.cpu(), group_size, wanted)
        return rows, {"train/kept_groups": kept, "dapo/groups_dropped": dropped,
                      "dapo/extra_samples": len(rewards) - len(rows)}

    def shape_rewards(self, rewards: Tensor, lengths: Tensor, budget: int) -> Tensor:
        if self.config.overlong_buffer <= 0:
            return rewards
        self._overlong_frac = (lengths > budget - self.config.overlong_buffer).float().mean().item()
        return rewards + overlong_penalty(lengths, budget, overlong_buffer=self.config.overlong_buffer,
                                          overlong_penalty=self.config.overlong_penalty).to(rewards)

    def advantage_metrics(self, adv: Tensor, inputs: Any, batch: Any) -> dict[str, float]:
        return {"dapo/overlong_frac": self._overlong_frac} if self.config.overlong_buffer > 0 else {}


# The tiny engine's response budget is 164 tokens at cpu and gpu scale (48 at smoke), not DAPO's 20,480: its overlong
# buffer keeps DAPO's proportion, a fifth of the budget (4,096 of 20,480): 33 tokens.
register_method(Method("dapo", Config, advantage="grpo", policy_loss="ppo", hooks=DapoHooks,
                       engine_defaults={"overlong_buffer": 33},
                       logs=frozenset({"train/kept_groups", "dapo/groups_dropped", "dapo/extra_samples",
                                       "dapo/overlong_frac"})))
