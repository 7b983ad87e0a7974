"""The stability map: where each method breaks along the off-policy ladder, and why.

**Where** (:func:`stability_frame`): each method's final held-out accuracy, ``actor/ppo_kl`` and
``actor/pg_clipfrac`` on each rung, the mean over seeds with its 90% t-interval. **Why**: a token's gradient
weight w(r) = −(1/Â)·∂ℓ/∂log π_θ at ratio r = π_θ/π_old — w = r for the plain surrogate, 0 once PPO's clip
binds, constant for a clipped weight (CISPO), rising then falling for a soft gate (SAPO) — computed by
autograd from the registered loss itself (:func:`rlkit.registry.policy_loss`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from rlkit import registry
from rlkit.lab.claims import run_name
from rlkit.lab.plots import PAGE_WIDTH, method_color
from rlkit.lab.runs import available_seeds, load_run
from rlkit.lab.specs import load_specs
from rlkit.lab.stats import t_interval
from rlkit.tiny.config import REGIMES, build_config

MAP_METRICS = {"val/acc_final": 1, "actor/ppo_kl": 10, "actor/pg_clipfrac": 10}
"""What the map reads of each run, with the number of last logged values it averages."""

RATIOS = (0.5, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 4.0)
"""The ratios the table shows: inside any trust region (0.8–1.2) and as far as a stale sampler takes them."""


def gradient_weight(method: str, ratio: float, adv: float = 1.0) -> float:
    """w(r) of one token of ``method`` (module doc) with the tiny engine's settings, computed in float64."""
    logp = torch.tensor([[float(ratio)]], dtype=torch.float64).log().requires_grad_()
    old = torch.zeros_like(logp)
    adv_t, mask = torch.full_like(old, float(adv)), torch.ones_like(old)
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
    """A row per (method, rung, metric) of the ``cells`` with runs: mean, 90% t-interval, seeds."""
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
    """The map: a panel per metric, the rungs left to right, a line per method with error bars."""
    import matplotlib.pyplot as plt

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


# ------------------------------------------------------------------------------------------------ on the pages
# The map's cells, as a table, a figure and in words; its rows and columns come from the specs, not typed.


def map_rows(specs: Sequence[Any] | None = None) -> dict[str, str]:
    """The map's rows, ``{label: run group}``: the methods and variants the specs run on the ladder."""
    rows: dict[str, str] = {}
    for spec in load_specs() if specs is None else specs:
        if not spec.method_page:
            continue
        name = spec.title.split(":")[0].strip() or spec.method
        if _on_the_map(spec.regimes):
            rows[name] = spec.method
        if _on_the_map(spec.variant_regimes):
            rows.update({f"{name}+{v.removeprefix(spec.method + '-')}": v for v in spec.variants})
    return rows


def map_rungs(specs: Sequence[Any] | None = None) -> tuple[str, ...]:
    """The map's columns: the rungs its rows run on, in :data:`rlkit.tiny.config.REGIMES`' order."""
    ran: set[str] = set()
    for spec in load_specs() if specs is None else specs:
        if spec.method_page:
            ran.update(r for regimes in (spec.regimes, spec.variant_regimes) if _on_the_map(regimes) for r in regimes)
    return tuple(r for r in REGIMES if r in ran)


def _on_the_map(regimes: Sequence[str]) -> bool:
    return "stress" in regimes and len(set(regimes) - {"standard", "stress"}) > 0

MAP_LABELS = {"val/acc_final": "held-out accuracy", "actor/ppo_kl": "KL within a step",
              "actor/pg_clipfrac": "tokens clipped"}
"""How the map's table names what it reads of each run (:data:`MAP_METRICS`)."""


def ladder_cells(results: str | Path, groups: Mapping[str, str] | None = None, rungs: Sequence[str] | None = None
                 ) -> tuple[dict[str, dict[str, str]], list[tuple[str, str]]]:
    """``(cells, missing)``: each label's ``{rung: run directory}`` with finished seeds, and the rest."""
    groups = map_rows() if groups is None else groups
    rungs = map_rungs() if rungs is None else rungs
    cells: dict[str, dict[str, str]] = {}
    missing: list[tuple[str, str]] = []
    for label, group in groups.items():
        for rung in rungs:
            name = run_name(group, rung)
            if (Path(results) / name).is_dir() and available_seeds(results, name):
                cells.setdefault(label, {})[rung] = name
            else:
                missing.append((label, rung))
    return cells, missing


def missing_line(missing: Sequence[tuple[str, str]], cells: int | None = None) -> str:
    """One line naming the map's cells without runs (all, if all ``cells`` are missing); empty if none."""
    if not missing:
        return ""
    if cells is not None and len(missing) >= cells:
        return f"No run of the map is in these results yet: all {cells} of its cells are left out."
    rungs: dict[str, list[str]] = {}
    for label, rung in missing:
        rungs.setdefault(label, []).append(rung)
    named = "; ".join(f"{label} on {', '.join(r)}" for label, r in rungs.items())
    return f"Left out of the map, no finished runs in these results: {named}."


def _cell(row, metric: str) -> str:
    """A map row as a table cell: its mean ± half its interval (the mean alone where it is unbounded)."""
    mean, lo, hi = float(row["mean"]), float(row["lo"]), float(row["hi"])
    half = (hi - lo) / 2 if np.isfinite(lo) and np.isfinite(hi) else float("nan")
    fmt = (lambda x: f"{100 * x:.2g}%") if metric == "actor/pg_clipfrac" else (
        (lambda x: f"{x:.3f}") if metric == "val/acc_final" else (lambda x: f"{x:.2g}"))
    return fmt(mean) if not np.isfinite(half) else f"{fmt(mean)} ± {fmt(half)}"


def ladder_table(frame: pd.DataFrame, rungs: Sequence[str] = tuple(REGIMES),
                 metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """The map as a table, each cell the mean over seeds ± half its 90% interval, "—" without a run."""
    shown = [m for m in MAP_LABELS if m in set(frame["metric"]) and (metrics is None or m in metrics)]
    present = [r for r in rungs if r in set(frame["rung"])]
    rows = {}
    for label in dict.fromkeys(frame["method"]):
        for metric in shown:
            part = frame[(frame["method"] == label) & (frame["metric"] == metric)].set_index("rung")
            if not part.empty:
                rows[(label, MAP_LABELS[metric])] = {r: _cell(part.loc[r], metric) if r in part.index else "—"
                                                     for r in present}
    table = pd.DataFrame.from_dict(rows, orient="index", columns=present)
    if len(table):
        table.index = pd.MultiIndex.from_tuples(table.index, names=["method", ""])
    return table


def ladder_figure(frame: pd.DataFrame, rungs: Sequence[str] = tuple(REGIMES),
                  groups: Mapping[str, str] | None = None):
    """:func:`stability_figure` of ``frame`` in the run groups' colours; None when it is empty."""
    if frame.empty:
        return None
    groups = map_rows() if groups is None else groups
    frame = frame.copy()
    for side in ("lo", "hi"):
        frame[side] = frame[side].where(np.isfinite(frame[side]), frame["mean"])
    colors = {label: method_color(groups.get(label, label)) for label in frame["method"].unique()}
    return stability_figure(frame, [r for r in rungs if r in set(frame["rung"])], colors)


def ladder_words(frame: pd.DataFrame, rungs: Sequence[str] = tuple(REGIMES)) -> list[str]:
    """A sentence per method: the first rung whose accuracy interval lies wholly below the standard one's."""
    acc = frame[frame["metric"] == "val/acc_final"]
    out = []
    for label in dict.fromkeys(acc["method"]):
        part = acc[acc["method"] == label].set_index("rung")
        if "standard" not in part.index:
            continue
        base = part.loc["standard"]
        ran = [r for r in rungs if r in part.index and r != "standard"]
        if not ran:
            continue
        below = [r for r in ran if part.loc[r, "hi"] < base["lo"]]
        last = ran[-1]
        if below:
            first = below[0]
            tail_text = "" if first == last else f"; on `{last}`, {part.loc[last, 'mean']:.3f}"
            out.append(f"{label} falls below its on-policy accuracy ({base['mean']:.3f}) first on `{first}` "
                       f"({part.loc[first, 'mean']:.3f}, {int(part.loc[first, 'seeds'])} seeds){tail_text}.")
        else:
            out.append(f"{label} falls below its on-policy accuracy ({base['mean']:.3f}) on none of the rungs it "
                       f"ran, up to `{last}` ({part.loc[last, 'mean']:.3f}).")
    return out


def weight_rows(methods: Sequence[str], ratios: Sequence[float] | None = None) -> pd.DataFrame:
    """Each method's w(r) for a positive and a negative advantage, rounded to 2 decimals."""
    ratios = RATIOS if ratios is None else ratios
    parts = {sign: weight_table(methods, ratios, adv) for sign, adv in (("A > 0", 1.0), ("A < 0", -1.0))}
    rows = {(m, sign): parts[sign].loc[m] for m in methods for sign in parts}
    table = pd.DataFrame.from_dict(rows, orient="index").round(2)
    table.index = pd.MultiIndex.from_tuples(table.index, names=["method", "w(r)"])
    return table
