"""The stability map's mechanism: how hard each loss pushes a token whose ratio has left 1.

A token's **gradient weight** is w(r) = −(1/Â)·∂ℓ/∂log π_θ for one token with ratio r = π_θ/π_old and advantage Â:
the factor by which the loss scales the policy gradient ∇log π_θ of that token. The plain surrogate −Â·r gives
w = r; PPO's clip gives 0 once the clip binds (r > 1 + ε_high with Â > 0, r < 1 − ε_low with Â < 0); a clipped
*weight* (CISPO) keeps a constant w; a soft gate (SAPO) lets w rise, then fall. Against a stale behaviour policy
ratios of 2–4 are common, and there a constant or rising w is no trust region.

Every number is computed by the registered loss itself (:func:`rlkit.registry.policy_loss`) with the tiny engine's
settings for the method, differentiated by autograd: the table is the code that trains, not a restatement of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from rlkit import registry
from rlkit.tiny.config import build_config

RATIOS = (0.5, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 4.0)
"""The ratios the table shows: inside any trust region (0.8–1.2) and as far as a stale sampler takes them."""


def gradient_weight(method: str, ratio: float, adv: float = 1.0) -> float:
    """w(r) of one token of ``method`` (module doc) with the tiny engine's settings, computed in float64."""
    logp = torch.tensor([[float(ratio)]], dtype=torch.float64).log().requires_grad_()
    old = torch.zeros_like(logp)
    adv_t = torch.full_like(old, float(adv))
    mask = torch.ones_like(old)
    configs = build_config(method, "cpu").method_configs
    entropy = torch.ones_like(old) if registry.get_method(method).needs_entropy(configs[method]) else None
    loss, _ = registry.policy_loss(method, logp, old, adv_t, mask, configs, entropy=entropy)
    (grad,) = torch.autograd.grad(loss, logp)
    return -grad.item() / adv + 0.0  # + 0.0: a cut gradient reads 0, not -0


def weight_table(methods: Sequence[str], ratios: Sequence[float] = RATIOS, adv: float = 1.0) -> pd.DataFrame:
    """w(r) per method (rows) and ratio (columns) for tokens with advantage ``adv`` (its sign is what matters)."""
    rows = {m: [gradient_weight(m, r, adv) for r in ratios] for m in methods}
    return pd.DataFrame.from_dict(rows, orient="index", columns=[f"r = {r:g}" for r in ratios])
