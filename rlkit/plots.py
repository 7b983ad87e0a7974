"""Learning curves and comparison figures from any run directory — tiny engine or verl — and their captions.

A run directory holds ``metrics.jsonl`` (verl's ``file`` logger format, :mod:`rlkit.metrics`) and, for tiny runs,
``config.json`` and ``env.json``. :func:`load_runs` reads any number of them; :func:`curves` draws chosen metrics
against steps, generated tokens or wall time, one line per method (the mean over its seeds, with a band from the
lowest to the highest seed when there are several); :func:`describe` is the caption every figure carries: scale,
model, data and seeds, so a figure can never pass for a paper's.

    rlkit plot reproductions/results/grpo/seed0 reproductions/results/aspo/seed0 --metric val/acc --out acc.png
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlkit.metrics import metrics_frame

X_AXES = {
    "step": "RL step",
    "tokens": "response tokens sampled (thousands)",
    "minutes": "wall time of the RL stage (minutes)",
}
COLORS = {"grpo": "#4c4c4c", "gspo": "#1f77b4", "aspo": "#2ca02c", "aepo": "#d62728", "spo": "#9467bd",
          "hapo": "#ff7f0e"}
"""One colour per method in every figure of the book (GRPO, the baseline, in grey)."""


@dataclass
class Run:
    """One run: its metrics (a DataFrame indexed by step) and, when present, its config and environment."""

    path: Path
    frame: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def method(self) -> str:
        """The method (tiny runs: from config.json; otherwise the directory's name, or its parent's for seed<k>)."""
        if "method" in self.config:
            return str(self.config["method"])
        name = self.path.name
        return self.path.parent.name if name.startswith("seed") else name

    @property
    def seed(self) -> int | None:
        return self.config.get("seed", self.env.get("seed"))

    @property
    def minutes(self) -> float:
        """Wall time of the RL stage: every step plus the method's own set-up (SPO's offline pass)."""
        return float(self._cumulative("timing_s/step", "timing_s/init").iloc[-1]) / 60

    @property
    def response_tokens(self) -> float:
        """Response tokens sampled over the run (tool output included)."""
        return float(self._cumulative("rollout/response_tokens").iloc[-1])

    def series(self, metric: str, x: str = "step") -> pd.Series:
        """``metric`` at the steps that logged it, indexed by the chosen x axis (see :data:`X_AXES`)."""
        if x not in X_AXES:
            raise ValueError(f"unknown x axis {x!r}; valid: {', '.join(X_AXES)}")
        if metric not in self.frame:
            raise KeyError(f"{self.path}: no metric {metric!r}; logged: {', '.join(sorted(self.frame.columns))}")
        values = self.frame[metric]
        if x == "step":
            axis = self.frame.index.to_series()
        elif x == "tokens":
            axis = self._cumulative("rollout/response_tokens") / 1e3
        else:  # the method's own set-up (SPO's offline pass, logged at step 0) counts as time spent
            axis = self._cumulative("timing_s/step", "timing_s/init") / 60
        keep = values.notna()
        return pd.Series(values[keep].to_numpy(), index=axis[keep].to_numpy(), name=metric)

    def _cumulative(self, metric: str, *optional: str) -> pd.Series:
        if metric not in self.frame:
            raise KeyError(f"{self.path}: no metric {metric!r}, needed for this x axis")
        total = self.frame[metric].fillna(0.0)
        for extra in optional:
            if extra in self.frame:
                total = total + self.frame[extra].fillna(0.0)
        return total.cumsum()


def load_run(path: str | Path) -> Run:
    """The run in directory ``path`` (or whose ``metrics.jsonl`` is ``path``)."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    metrics = path / "metrics.jsonl"
    if not metrics.exists():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (is it a run directory?)")
    extra = {name: json.loads((path / f"{name}.json").read_text()) if (path / f"{name}.json").exists() else {}
             for name in ("config", "env")}
    return Run(path=path, frame=metrics_frame(metrics), **extra)


def load_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run in ``paths``; a directory without ``metrics.jsonl`` contributes the runs below it."""
    runs = []
    for p in map(Path, paths):
        if (p / "metrics.jsonl").exists() or p.is_file():
            runs.append(load_run(p))
        else:
            found = sorted(p.glob("**/metrics.jsonl"))
            if not found:
                raise FileNotFoundError(f"{p}: no metrics.jsonl in or below it")
            runs.extend(load_run(f) for f in found)
    return runs


def by_method(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by method, in the order methods first appear."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.method, []).append(run)
    return groups


def seed_band(runs: Sequence[Run], metric: str, x: str = "step") -> pd.DataFrame:
    """``metric`` over seeds on a shared x grid: columns ``mean``, ``low``, ``high`` (min and max over seeds), ``n``.

    Steps are shared by seeds; for tokens and minutes each seed is interpolated onto the union of their x values
    inside the range they all cover."""
    series = [r.series(metric, x) for r in runs]
    if x == "step":
        table = pd.concat(series, axis=1)
    else:
        lo, hi = max(s.index.min() for s in series), min(s.index.max() for s in series)
        grid = np.unique(np.concatenate([s.index.to_numpy() for s in series]))
        grid = grid[(grid >= lo) & (grid <= hi)]
        table = pd.DataFrame({i: np.interp(grid, s.index.to_numpy(), s.to_numpy()) for i, s in enumerate(series)},
                             index=grid)
    return pd.DataFrame({"mean": table.mean(axis=1), "low": table.min(axis=1), "high": table.max(axis=1),
                         "n": table.notna().sum(axis=1)})


def describe(runs: Sequence[Run]) -> str:
    """The caption of a figure: scale, model, data and seeds of the runs drawn (from their config.json)."""
    configs = [r.config for r in runs if r.config]
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    seed_text = f"seeds {', '.join(map(str, seeds))}" if seeds else "seeds unknown"
    if not configs:
        return f"{len(runs)} run(s), {seed_text}"
    c = configs[0]
    if "dataset" in c:  # a verl run written by `rlkit launch`
        models = sorted({str(cfg.get("model")) for cfg in configs})
        data = sorted({str(cfg.get("dataset")) for cfg in configs})
        gpus = sorted({f"{cfg.get('gpus')} GPU(s) × {cfg.get('nodes', 1)} node(s)" for cfg in configs})
        return f"verl · {', '.join(models)} · {', '.join(data)} · {', '.join(gpus)} · {seed_text}"
    sft = c.get("sft", {})
    scales = sorted({str(cfg.get("scale", "?")) for cfg in configs})
    model = f"tiny decoder d={sft.get('d_model')}×{sft.get('n_layers')} layers, SFT {sft.get('steps')} steps"
    task = sft.get("task", {})
    data = (f"arithmetic word problems ({sft.get('form')} form, {task.get('min_ops')}–{task.get('max_ops')} ops), "
            f"pool {c.get('pool_size')}, held-out {c.get('eval_size')}")
    shapes = {str(cfg.get("method")): f"{cfg.get('prompts_per_step')}×{cfg.get('group_size')}" for cfg in configs}
    if len(set(shapes.values())) == 1:
        batch = f"{next(iter(shapes.values()))} samples/step"
    else:
        batch = "samples/step " + ", ".join(f"{m} {shape}" for m, shape in shapes.items())
    return f"scale {'/'.join(scales)} · {model} · {data} · {batch} · {seed_text} · rlkit tiny engine, not the papers' runs"


def curves(
    runs: Sequence[Run],
    metrics: Sequence[str],
    *,
    x: str = "step",
    titles: Sequence[str] | None = None,
    caption: bool = True,
    ncols: int | None = None,
    width: float = 4.2,
):
    """One panel per metric, one line per method (mean over seeds, min–max band); returns the Figure."""
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("no runs to plot")
    metrics = list(metrics)
    for metric in metrics:
        if not any(metric in r.frame for r in runs):
            logged = sorted(set().union(*(r.frame.columns for r in runs)))
            raise KeyError(f"no run logged metric {metric!r}; logged: {', '.join(logged)}")
    ncols = ncols or min(3, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 3.2 * nrows + (0.5 if caption else 0)),
                             squeeze=False)
    groups = by_method(runs)
    for i, metric in enumerate(metrics):
        ax = axes[i // ncols][i % ncols]
        for method, group in groups.items():
            if not all(metric in r.frame for r in group):
                continue
            band = seed_band(group, metric, x)
            color = COLORS.get(method)
            label = f"{method} ({len(group)} seed{'s' if len(group) > 1 else ''})"
            ax.plot(band.index, band["mean"], label=label, color=color, lw=1.6,
                    marker="o" if len(band) <= 12 else None, ms=3)
            if len(group) > 1:
                ax.fill_between(band.index, band["low"], band["high"], color=color, alpha=0.15, lw=0)
        ax.set_title(titles[i] if titles else metric, fontsize=10)
        ax.set_xlabel(X_AXES[x], fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for j in range(len(metrics), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    if caption:
        fig.text(0.01, 0.005, describe(runs), fontsize=7, color="#555555", wrap=True)
    fig.tight_layout(rect=(0, 0.05 if caption else 0, 1, 1))
    return fig


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (PNG), creating its directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path
