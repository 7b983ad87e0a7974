"""Learning curves and comparison figures from any run directory, tiny engine or verl, and their captions
(:func:`describe`: scale, model, data, seeds, so a figure can never pass for a paper's).

    rlkit plot reproductions/results/grpo/seed0 reproductions/results/aspo/seed0 --metric val/acc --out acc.png
"""

from __future__ import annotations

import functools
import textwrap
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlkit.lab import paths
from rlkit.lab.runs import SHARES, X_AXES, Run

PALETTE = ("#7f7f7f", "#0072B2", "#009E73", "#D55E00", "#CC79A7", "#E69F00", "#56B4E9", "#9A8200", "#000000",
           "#882255", "#8c564b", "#44AA99", "#332288", "#117733", "#AA4499", "#661100", "#6699CC")
"""The methods' colours by their place in :func:`methods`: grey, then Okabe and Ito's hues, then others."""


@functools.lru_cache(maxsize=None)
def _pages(specs: Path) -> dict[str, str]:
    """Each method with a page of its own among the specs in ``specs``: the page's file name."""
    import yaml  # the notebooks' extra, as matplotlib

    pages: dict[str, list[str]] = {}
    for path in specs.glob("*.yaml"):
        spec = yaml.safe_load(path.read_text()) or {}
        if spec.get("method") and spec.get("notebook") and not spec.get("topic"):
            pages.setdefault(spec["method"], []).append(Path(spec["notebook"]).name)
    return {method: min(names) for method, names in pages.items()}


def methods() -> list[str]:
    """Every registered method in the book's order: those with a page in page order, then the rest by name."""
    from rlkit.registry import list_methods

    try:
        pages = _pages(paths.specs_dir())
    except paths.ProjectNotFound:
        pages = {}
    return sorted(list_methods()["method"], key=lambda m: (m not in pages, pages.get(m, ""), m))


def method_color(method: str) -> str:
    """``method``'s colour in :data:`PALETTE`; an unknown name gets a free one, chosen from the name."""
    order = methods()
    if method in order:
        return PALETTE[order.index(method) % len(PALETTE)]
    free = PALETTE[len(order):] or PALETTE
    return free[zlib.crc32(method.encode()) % len(free)]


def by_method(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by method (variants apart: :attr:`Run.label`), in the order they first appear."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


def seed_band(runs: Sequence[Run], metric: str, x: str = "step") -> pd.DataFrame:
    """``metric`` over seeds on a shared x grid: columns ``mean``, ``low``, ``high``, ``n``."""
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
    counts = {label: sum(r.seed is not None for r in group) for label, group in by_method(runs).items()}
    if len(set(counts.values())) > 1:  # the sequential seed rule gave some groups more seeds: say how many each
        seed_text += " (" + ", ".join(f"{label} {n}" for label, n in counts.items()) + ")"
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


BOOK_RC = {"figure.dpi": 100, "savefig.dpi": 110, "font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11,
           "xtick.labelsize": 10, "ytick.labelsize": 10, "legend.fontsize": 10, "figure.titlesize": 12}
"""Matplotlib settings of the book's figures: no text below 10 pt."""
PAGE_WIDTH = 9.0
"""Inches: the widest figure (900 px at 100 dpi), shown at about 3/4 size in the book's text column."""


def book_style() -> None:
    """Use :data:`BOOK_RC` for every later figure (the notebooks call it once, beside their imports)."""
    import matplotlib

    matplotlib.rcParams.update(BOOK_RC)


def panels(n: int, *, ncols: int = 2, width: float = PAGE_WIDTH, height: float = 3.4, **kwargs):
    """A figure of ``n`` panels, ``ncols`` a row: ``(fig, axes, spare)``, ``spare`` the unused axes."""
    import matplotlib.pyplot as plt

    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(width, height * nrows), squeeze=False, **kwargs)
    flat = list(grid.flat)
    for ax in flat[n:]:
        ax.set_axis_off()
    return fig, flat[:n], flat[n:]


def legend_outside(fig, axes: Sequence[Any], spare: Sequence[Any] = (), **kwargs):
    """One legend for all ``axes`` (each label once): in the first ``spare`` axes, else above the panels."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if not handles:
        return None
    if spare:
        return spare[0].legend(list(handles.values()), list(handles), **{"loc": "center", "frameon": False, **kwargs})
    return fig.legend(list(handles.values()), list(handles), **{
        "loc": "lower center", "bbox_to_anchor": (0.5, 1.0), "ncol": min(len(handles), 4), "frameon": False, **kwargs})


def add_caption(fig, text: str, fontsize: float = 10):
    """``text`` in grey under everything drawn so far, wrapped to the figure's width. Call it last."""
    bottom = fig.get_tightbbox(fig.canvas.get_renderer()).y0 / fig.get_figheight()  # inches → figure fraction
    chars = int(fig.get_figwidth() * 72 / (0.55 * fontsize))
    return fig.text(0.01, min(bottom, 0.0) - 0.01, textwrap.fill(text, chars), fontsize=fontsize, color="#555555",
                    va="top")


def curves(runs: Sequence[Run], metrics: Sequence[str], *, x: str | Sequence[str] = "step",
           titles: Sequence[str] | None = None, caption: bool = True, ncols: int = 2,
           width: float = PAGE_WIDTH, height: float = 3.2, colors: Mapping[str, str] | None = None):
    """One panel per metric, one line per run group (mean, min–max band over seeds), legend and caption."""
    if not runs:
        raise ValueError("no runs to plot")
    metrics = list(metrics)
    xs = [x] * len(metrics) if isinstance(x, str) else list(x)
    if len(xs) != len(metrics):
        raise ValueError(f"{len(xs)} x axes for {len(metrics)} metrics")
    for metric in metrics:
        if not any(metric in r.frame for r in runs):
            logged = sorted(set().union(*(r.frame.columns for r in runs)))
            raise KeyError(f"no run logged metric {metric!r}; logged: {', '.join(logged)}")
    fig, axes, spare = panels(len(metrics), ncols=ncols, width=width, height=height)
    groups = by_method(runs)
    styles = line_styles(groups)
    for i, (ax, metric, xi) in enumerate(zip(axes, metrics, xs)):
        for method, group in groups.items():
            if not all(metric in r.frame for r in group):
                continue
            band = seed_band(group, metric, xi)
            # a variant (grpo-stress, aspo-eq1): its method's colour, dashed — unless the page gives it its own
            color = (colors or {}).get(method) or method_color(group[0].method)
            label = f"{method} ({len(group)} seed{'s' if len(group) > 1 else ''})"
            ls, marker = styles[method]
            ax.plot(band.index, band["mean"], label=label, color=color, lw=1.8, ls=ls,
                    marker=marker if len(band) <= 12 else None, ms=4)
            if len(group) > 1:
                ax.fill_between(band.index, band["low"], band["high"], color=color, alpha=0.15, lw=0)
        ax.set_title(titles[i] if titles else metric)
        ax.set_xlabel(X_AXES[xi])
        ax.grid(alpha=0.3)
        steady_axis(ax, metric)
    fig.tight_layout()
    legend_outside(fig, axes, spare)
    if caption:
        add_caption(fig, describe(runs))
    return fig


MIN_SPAN = 0.02
"""An auto-scaled panel spans at least this share of its values' size: noise in the 4th digit stays flat."""


def steady_axis(ax, metric: str) -> None:
    """Fixed y-limits where auto-scaling would mislead: [0, 1] for a share, else at least :data:`MIN_SPAN`."""
    if metric in SHARES:
        ax.set_ylim(0.0, 1.0)
    else:
        low, high = ax.get_ylim()
        size = max(abs(low), abs(high))
        if size > 0 and high - low < MIN_SPAN * size:
            middle = (low + high) / 2
            ax.set_ylim(middle - MIN_SPAN * size / 2, middle + MIN_SPAN * size / 2)
    try:
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    except AttributeError:  # a formatter other than matplotlib's scalar one (a log axis): left as it is
        pass


#: Line style and marker of a method's variants, in the order they appear (the method itself: solid, circles).
VARIANT_STYLES = [("--", "o"), (":", "s"), ("-.", "^"), ((0, (5, 1, 1, 1, 1, 1)), "D"), ((0, (1, 3)), "v")]


def line_styles(groups: dict[str, list[Run]]) -> dict[str, tuple]:
    """``{label: (linestyle, marker)}``: a method solid, circles; its variants :data:`VARIANT_STYLES`."""
    seen: dict[str, int] = {}
    styles = {}
    for label, group in groups.items():
        if label == group[0].method:
            styles[label] = ("-", "o")
            continue
        k = seen.get(group[0].method, 0)
        seen[group[0].method] = k + 1
        styles[label] = VARIANT_STYLES[k % len(VARIANT_STYLES)]
    return styles


def final_dots(groups: dict[str, list[Run]], metric: str = "val/acc_final", *, xlabel: str | None = None):
    """An ablation as a dot plot: a row per label, each seed's last ``metric`` a dot, their mean a bar."""
    import matplotlib.pyplot as plt

    labels = list(groups)
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH * 0.75, 0.45 * len(labels) + 1.2))
    for y, label in enumerate(reversed(labels)):
        values = [r.frame[metric].dropna().iloc[-1] for r in groups[label] if metric in r.frame]
        colour = method_color(groups[label][0].method)
        ax.plot(values, [y] * len(values), "o", color=colour, alpha=0.7, ms=6)
        if values:
            ax.plot([sum(values) / len(values)] * 2, [y - 0.3, y + 0.3], color=colour, lw=2.5)
    ax.set_yticks(range(len(labels)), list(reversed(labels)))
    ax.set_ylim(-0.7, len(labels) - 0.3)
    ax.set_xlabel(xlabel or f"{metric} at the last step (dots: seeds; bar: their mean)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def image_path(path: str | Path) -> Path:
    """The file :func:`save` writes for ``path`` (``.png`` if none); ``ValueError`` if unwritable."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--out {path} is a directory: give the image's file name, e.g. {path / 'curves.png'}")
    if not path.suffix:
        path = path.with_name(path.name + ".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise ValueError(f"--out {path}: {path.suffix} is not an image format matplotlib writes; give a .png path "
                         f"(or one of .{', .'.join(sorted(formats))})")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"--out {path}: {parent} is a file, not a directory")
    return path


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to :func:`image_path` of ``path``, creating its directory; returns the path written."""
    path = image_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def legend_below(ax, ncol: int = 1, **kwargs):
    """``ax``'s legend under its x-axis label, outside the data (for panels whose lines differ)."""
    return ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, frameon=False, **kwargs)
