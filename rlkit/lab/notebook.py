"""What the method notebooks share: rlkit's own source on the page, the run-and-compare section, and small helpers.

Notebooks never copy library code: :func:`show_source` displays it with :mod:`inspect`, so the page always shows
the code that ran. By default it folds a function's argument checks (``if …: raise``, ``warnings.warn``,
``check_shapes(…)``) into one comment that says where they are, so the page shows the math.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlkit.lab import claims, paths, plots
from rlkit.lab.plots import Run
from rlkit.lab.reproduce import ensure_run, get_spec


def show_source(*objects: Any, checks: bool = False) -> None:
    """Display the source of functions, classes or modules, highlighted, each under its qualified name.

    ``checks=False`` folds a function's argument checks into comments naming their lines (:func:`fold_checks`);
    ``checks=True`` shows every line."""
    from IPython.display import Code, Markdown, display

    for obj in objects:
        name = f"{obj.__module__}.{obj.__qualname__}" if hasattr(obj, "__qualname__") else obj.__name__
        path = Path(inspect.getsourcefile(obj)).resolve()
        lines, line = inspect.getsourcelines(obj)
        source, folded = textwrap.dedent("".join(lines)), 0
        if not checks:
            source, folded = fold_checks(source, first_line=line, filename=path.name)
        note = f" ({folded} lines of argument checks folded)" if folded else ""
        display(Markdown(f"`{name}` — `{path.parent.name}/{path.name}`, line {line}{note}"))
        display(Code(source, language="python"))


def _is_check(stmt: ast.stmt) -> bool:
    """An argument check: ``if …: raise …`` / ``warnings.warn(…)``, or a call to ``check_*`` / ``_check_*``."""
    def call_name(node: ast.AST) -> str:
        func = node.func if isinstance(node, ast.Call) else None
        return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""

    def raises_or_warns(s: ast.stmt) -> bool:
        return isinstance(s, ast.Raise) or (isinstance(s, ast.Expr) and call_name(s.value) == "warn")

    if isinstance(stmt, ast.If):
        return not stmt.orelse and all(raises_or_warns(s) for s in stmt.body)
    return isinstance(stmt, ast.Expr) and call_name(stmt.value).lstrip("_").startswith("check")


def _check_runs(body: list[ast.stmt]) -> list[list[ast.stmt]]:
    """Runs of consecutive argument checks in ``body`` and, recursively, in the blocks it contains; a block made
    of checks only is left alone (folding it would leave an empty block)."""
    runs: list[list[ast.stmt]] = []
    if not all(_is_check(s) for s in body):
        previous = None
        for stmt in body:
            if _is_check(stmt):
                if previous is not None and _is_check(previous):
                    runs[-1].append(stmt)
                else:
                    runs.append([stmt])
            previous = stmt
    for stmt in body:
        if not _is_check(stmt):
            for block in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, block, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    runs += _check_runs(inner)
    return runs


def fold_checks(source: str, *, first_line: int = 1, filename: str = "") -> tuple[str, int]:
    """``source`` of one function (dedented) with each run of consecutive argument checks replaced by a comment
    naming their lines; returns ``(source, lines folded)``. Other objects come back unchanged."""
    code = textwrap.dedent(source)
    tree = ast.parse(code)
    func = tree.body[0] if tree.body else None
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return source, 0
    lines = code.splitlines()
    folded = 0
    for run in sorted(_check_runs(func.body), key=lambda r: r[0].lineno, reverse=True):
        start, end = run[0].lineno, run[-1].end_lineno
        a, b = first_line + start - 1, first_line + end - 1
        where = f"{filename} line {a}" if a == b else f"{filename} lines {a}–{b}"
        lines[start - 1:end] = [" " * run[0].col_offset + f"# … argument checks ({where}) …"]
        folded += end - start + 1
    return "\n".join(lines) + "\n", folded


def tail(runs, metric: str, window: int = 10) -> float:
    """Mean of the last ``window`` logged values of ``metric`` in a run — or, for a list of runs (seeds), the mean of
    theirs (the claims' rule for the end of a run)."""
    if hasattr(runs, "frame"):  # one run
        return float(runs.frame[metric].dropna().iloc[-window:].mean())
    return sum(tail(r, metric, window) for r in runs) / len(runs)


def final_state(run: Run, map_location: str = "cpu") -> dict[str, Any]:
    """A tiny run's final checkpoint (model, optimizer, SPO's tracker...), with a clear error where it is absent:
    published results keep metrics and evaluations only, not checkpoints (tens of MB each)."""
    import torch

    path = run.path / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: this run's final checkpoint is not in {run.path.parent.parent} (published results "
            "keep metrics only, checkpoints are not committed). Execute this notebook on runs trained here: "
            "`rlkit reproduce --only <spec>` (results in reproductions/results), or `--results DIR`.")
    return torch.load(path, map_location=map_location, weights_only=True)


def results_dir(results: str | Path | None) -> Path:
    """The notebooks' ``results`` parameter: None means the project's ``reproductions/results``."""
    return Path(results) if results else paths.results_dir()


def spec_runs(name: str, *, scale: str, seeds: int, results: str | Path | None, device: str = "cpu",
              progress: bool = True, regime: str = "standard", variant: str | None = None) -> list[Run]:
    """Seeds 0..``seeds``−1 of a reproduction's run — its method in ``regime``, or one of its ``variant`` runs
    (``reproductions/specs/<name>.yaml``) — trained, resumed or reused (:func:`rlkit.lab.reproduce.ensure_run`)."""
    spec = get_spec(name)
    if spec.method is None:
        raise ValueError(f"spec {name!r} trains no method")
    if variant is not None and variant not in spec.variants:
        raise KeyError(f"spec {name!r} has no variant {variant!r}; valid: {', '.join(spec.variants) or 'none'}")
    overrides = spec.variants[variant] if variant else {}
    return [ensure_run(spec.method, scale=scale, seed=k, results=results_dir(results), device=device,
                       name=variant, regime=regime if variant is None else "standard", overrides=overrides,
                       progress=progress) for k in range(seeds)]


def compare_runs(
    method: str,
    metrics: Sequence[str],
    *,
    scale: str,
    seeds: int,
    results: str | Path | None,
    device: str = "cpu",
    progress: bool = True,
    baseline: str | None = "grpo",
    regime: str = "standard",
    variants: Sequence[str] = (),
    titles: Sequence[str] | None = None,
    x: str = "step",
    figure: str = "curves.png",
):
    """Train (or reuse) ``seeds`` seeds of ``method`` and of its ``baseline`` in ``regime`` (and of the spec's
    ``variants``), draw ``metrics`` (mean over seeds, min–max band), save the figure under
    ``<results>/<method>/figures/`` and return ``(runs, fig)``."""
    kw = dict(scale=scale, seeds=seeds, results=results, device=device, progress=progress)
    runs = spec_runs(baseline, regime=regime, **kw) if baseline and baseline != method else []
    runs += spec_runs(method, regime=regime, **kw)
    for v in variants:
        runs += spec_runs(method, variant=v, **kw)
    fig = plots.curves(runs, metrics, titles=titles, x=x)
    plots.save(fig, results_dir(results) / method / "figures" / figure)
    return runs, fig


def regime_settings(method: str, scale: str, regime: str = "stress") -> str:
    """The sentences that explain ``regime``'s settings, with the values ``method``'s runs at ``scale`` use
    (:data:`rlkit.tiny.config.REGIMES` under the scale's sizes), beside the standard run's: a page quotes the
    config, never a typed number."""
    from rlkit.tiny.config import build_config

    std, cfg = build_config(method, scale), build_config(method, scale, regime=regime)
    return (f"`staleness`: the rollouts of each step are sampled by the policy of {cfg.staleness} steps earlier, as "
            "in an asynchronous trainer; the loss's ratio is taken against that policy, so it leaves 1 from the "
            f"first mini-batch on. `mini_batches`: {cfg.mini_batches} optimizer steps per rollout batch (standard: "
            f"{std.mini_batches}), each further from the sampling policy than the last. `lr`, `warmup_steps`: "
            f"{cfg.lr:g} (standard: {std.lr:g}), reached after {cfg.warmup_steps} steps. `steps`: {cfg.steps} RL "
            f"steps (standard: {std.steps}). Everything else is the standard run's.")


def claims_table(name: str, *, seed: int | None = None, seeds: int | None = None,
                 results: str | Path | None = None):
    """The spec's claims (the rules: :data:`rlkit.lab.claims.RULES`) as HTML: a "What we found" box in plain
    sentences, the narrow table (claim and finding, estimate, coloured verdict; details folded) and the verdict
    words' glossary. The records are those of ``claims.json`` beside the runs when they were judged on the same
    seeds (one ``seed``, or seeds 0..``seeds``−1), else judged now from the runs."""
    spec = get_spec(name)
    chosen = [seed] if seed is not None else list(range(seeds or spec.seeds))
    root = results_dir(results)
    records = claims.load(root, spec.notebook, chosen) or claims.judge_spec(spec, root, chosen)
    from IPython.display import HTML

    return HTML(claims.found_box(records) + claims.html(records) + claims.glossary_html())
