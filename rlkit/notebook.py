"""What the method notebooks share: rlkit's own source on the page, and the run-and-compare section.

Notebooks never copy library code (STYLE §9): :func:`show_source` displays it with :mod:`inspect`, so the page
always shows the code that ran.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlkit import plots
from rlkit.reproduce import RESULTS_DIR, ensure_run, get_spec, judge_claims


def show_source(*objects: Any) -> None:
    """Display the source of functions, classes or modules, highlighted, each under its qualified name."""
    from IPython.display import Code, Markdown, display

    for obj in objects:
        name = f"{obj.__module__}.{obj.__qualname__}" if hasattr(obj, "__qualname__") else obj.__name__
        path = Path(inspect.getsourcefile(obj)).resolve()
        _, line = inspect.getsourcelines(obj)
        display(Markdown(f"`{name}` — `{path.parent.name}/{path.name}`, line {line}"))
        display(Code(inspect.getsource(obj), language="python"))


def results_dir(results: str | Path | None) -> Path:
    """The notebooks' ``results`` parameter: None means this checkout's ``reproductions/results``."""
    return Path(results) if results else RESULTS_DIR


def compare_runs(
    method: str,
    metrics: Sequence[str],
    *,
    scale: str,
    seed: int,
    results: str | Path | None,
    device: str = "cpu",
    progress: bool = True,
    baseline: str | None = "grpo",
    titles: Sequence[str] | None = None,
    x: str = "step",
    figure: str = "curves.png",
):
    """Train (or reuse) ``method`` and its ``baseline`` at ``scale``/``seed``, draw ``metrics`` for both, save the
    figure under ``<results>/<method>/seed<seed>/figures/`` and return ``(runs, fig)``."""
    root = results_dir(results)
    names = [baseline, method] if baseline and baseline != method else [method]
    runs = [ensure_run(m, scale=scale, seed=seed, results=root, device=device, progress=progress) for m in names]
    fig = plots.curves(runs, metrics, titles=titles, x=x)
    plots.save(fig, root / method / f"seed{seed}" / "figures" / figure)
    return runs, fig


def claims_table(name: str, *, seed: int | None = None, seeds: int | None = None,
                 results: str | Path | None = None):
    """The spec's claims judged on this notebook's runs (one ``seed``, or seeds 0..``seeds``−1), as a styled
    table whose verdict column is coloured."""
    table = judge_claims(get_spec(name), results_dir(results), seeds=[seed] if seed is not None else
                         list(range(seeds or get_spec(name).seeds)))
    colours = {"holds": "#d8f0d8", "does not hold": "#f6d5d5", "not testable at this scale": "#eeeeee"}
    return table.style.hide(axis="index").map(lambda v: f"background-color: {colours.get(v, 'white')}",
                                              subset=["verdict"])
