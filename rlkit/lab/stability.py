"""The stability map: where each method breaks along the off-policy ladder, and why.

**Where** (:func:`stability_frame`, :func:`stability_figure`): each method's final held-out accuracy, its
``actor/ppo_kl`` and the share of its tokens whose gradient the clip cuts (``actor/pg_clipfrac``) on each rung —
the mean over seeds with its t-interval (:func:`rlkit.lab.stats.t_interval`, 90%). **Why** (below): how hard each
loss pushes a token whose ratio has left 1.

A token's **gradient weight** is w(r) = −(1/Â)·∂ℓ/∂log π_θ for one token with ratio r = π_θ/π_old and advantage Â:
the factor by which the loss scales the policy gradient ∇log π_θ of that token. The plain surrogate −Â·r gives
w = r; PPO's clip gives 0 once the clip binds (r > 1 + ε_high with Â > 0, r < 1 − ε_low with Â < 0); a clipped
*weight* (CISPO) keeps a constant w; a soft gate (SAPO) lets w rise, then fall. Against a stale behaviour policy
ratios of 2–4 are common, and there a constant or rising w is no trust region.

Every number is computed by the registered loss itself (:func:`rlkit.registry.policy_loss`) with the tiny engine's
settings for the method, differentiated by autograd: the table is the code that trains, not a restatement of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rlkit import registry
from rlkit.lab.runs import available_seeds, load_run
from rlkit.lab.stats import t_interval
from rlkit.tiny.config import build_config

MAP_METRICS = {"val/acc_final": 1, "actor/ppo_kl": 10, "actor/pg_clipfrac": 10}
"""What the map reads of each run, with the number of last logged values it averages (the final evaluation; the
last 10 steps, the claims' window)."""

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


def stability_frame(results: str | Path, cells: Mapping[str, Mapping[str, str]],
                    metrics: Mapping[str, int] = MAP_METRICS) -> pd.DataFrame:
    """One row per (method, rung, metric): the mean over seeds and its 90% t-interval, and the number of seeds.
    ``cells`` maps each method's label to ``{rung: run directory name}`` under ``results``; a cell without
    finished runs is left out."""
    rows = []
    for label, rungs in cells.items():
        for rung, name in rungs.items():
            runs = [load_run(Path(results) / name / f"seed{k}") for k in available_seeds(results, name)]
            for metric, window in metrics.items():
                values = [float(r.frame[metric].dropna().iloc[-window:].mean()) for r in runs
                          if metric in r.frame and not r.frame[metric].dropna().empty]
                if not values:
                    continue
                mean, lo, hi = t_interval(values)
                rows.append({"method": label, "rung": rung, "metric": metric, "mean": mean, "lo": lo, "hi": hi,
                             "seeds": len(values)})
    return pd.DataFrame(rows, columns=["method", "rung", "metric", "mean", "lo", "hi", "seeds"])


def stability_figure(frame: pd.DataFrame, rungs: Sequence[str], colors: Mapping[str, str] | None = None):
    """The map: one panel per metric of ``frame`` (:func:`stability_frame`), the rungs left to right in ``rungs``'
    order, a line per method with its seeds' interval as error bars. Returns the figure."""
    import matplotlib.pyplot as plt

    from rlkit.lab.plots import PAGE_WIDTH

    shown = [m for m in MAP_METRICS if m in set(frame["metric"])]
    fig, axes = plt.subplots(1, len(shown), figsize=(PAGE_WIDTH, 3.2), squeeze=False)
    x = {rung: i for i, rung in enumerate(rungs)}
    for ax, metric in zip(axes[0], shown):
        part = frame[frame["metric"] == metric]
        for k, (label, rows) in enumerate(part.groupby("method", sort=False)):
            rows = rows.sort_values("rung", key=lambda r: r.map(x))
            xs = rows["rung"].map(x) + (k - len(part["method"].unique()) / 2) * 0.04  # a little apart
            ax.errorbar(xs, rows["mean"], yerr=[rows["mean"] - rows["lo"], rows["hi"] - rows["mean"]],
                        marker="o", ms=4, capsize=2, label=label, color=(colors or {}).get(label))
        ax.set_xticks(range(len(rungs)), rungs, rotation=30, ha="right")
        ax.set_title(metric)
        if metric == "actor/ppo_kl" and (part["lo"] > 0).all():
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
