"""Reproductions: experiment specs executed with papermill, the runs they make, and the paper claims they test.

A spec (``reproductions/specs/<name>.yaml``) names a notebook, the method it runs, its seeds, scale and extra
parameters, and the papers' claims with how each is judged from the run files. :func:`reproduce` converts each
notebook (jupytext MyST → ipynb) and executes it with papermill, once per seed for a method's notebook, into
``<results>/<name>/seed<k>/`` — the executed notebook beside the run's ``metrics.jsonl``, ``config.json``,
``env.json`` and figures; once for the overview and the comparison, into ``<results>/<name>/``. A failing notebook
stops everything with its cell and error.

Inside a notebook, :func:`ensure_run` trains a method (or reuses a finished run, or resumes a killed one), and
:func:`judge_claims` turns a spec's claims into a table of *holds / does not hold / not testable at this scale*
computed from the metrics files — never typed in.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rlkit.plots import Run, load_run

REPO = Path(__file__).resolve().parent.parent
SPECS_DIR = REPO / "reproductions" / "specs"
RESULTS_DIR = REPO / "reproductions" / "results"
EXPECT = ("lower", "higher", "not_lower", "equal", "rise", "at_least")
VERDICTS = ("holds", "does not hold", "not testable at this scale")


@dataclass
class Claim:
    """A paper's claim and the rule that judges it from metrics (see :func:`judge_claims`)."""

    claim: str
    """What the paper says, in a sentence."""
    source: str
    """Where: paper, section, figure or table (and the paper's own numbers)."""
    metric: str | None = None
    """The logged metric that tests it (None: not testable at this scale; say why in ``reason``)."""
    expect: str | None = None
    """``lower`` / ``higher`` than the baseline's, ``not_lower`` (at most ``tolerance`` below it), ``equal`` to it
    (within ``tolerance``), ``rise`` over the run's own first value, or ``at_least`` ``tolerance`` in absolute terms."""
    baseline: str = "grpo"
    """Method compared against (``lower``, ``higher``, ``equal``)."""
    window: int = 3
    """How many of the last logged values of ``metric`` are averaged (per seed)."""
    tolerance: float = 0.0
    """``equal``/``not_lower``: largest difference that still holds; ``at_least``: the threshold; others: the
    smallest effect that counts."""
    reason: str = ""
    """Why the claim is not testable here, when ``metric`` is None."""

    def __post_init__(self) -> None:
        if self.metric is not None and self.expect not in EXPECT:
            raise ValueError(f"claim {self.claim!r}: expect must be one of {', '.join(EXPECT)}, got {self.expect!r}")
        if self.metric is None and not self.reason:
            raise ValueError(f"claim {self.claim!r}: a claim without a metric needs a reason")


@dataclass
class Spec:
    """One reproduction: ``reproductions/specs/<name>.yaml``."""

    name: str
    notebook: str
    """Path of the MyST notebook, relative to the repository root."""
    title: str = ""
    method: str | None = None
    """The method the notebook trains (None: overview / comparison, executed once, not per seed)."""
    paper: str = ""
    """Citation key in book/references.bib."""
    scale: str = "cpu"
    seeds: int = 1
    parameters: dict[str, Any] = field(default_factory=dict)
    """Extra papermill parameters."""
    claims: list[Claim] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> Spec:
        import yaml

        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a spec is a mapping")
        valid = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - valid)
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown}; valid: {', '.join(sorted(valid))}")
        claims = [Claim(**c) for c in raw.pop("claims", [])]
        return cls(claims=claims, **raw)

    def run_dirs(self, results: Path, seeds: int | None = None) -> list[Path]:
        """Where the executed notebook (and, for a method, its run) goes: one directory per seed."""
        if self.method is None:
            return [results / self.name]
        return [results / self.name / f"seed{k}" for k in range(seeds or self.seeds)]


def load_specs(specs_dir: str | Path = SPECS_DIR) -> list[Spec]:
    """Every spec, in notebook order (00_overview first, 07_comparison last)."""
    specs = [Spec.load(p) for p in sorted(Path(specs_dir).glob("*.yaml"))]
    if not specs:
        raise FileNotFoundError(f"no specs in {specs_dir}")
    return sorted(specs, key=lambda s: Path(s.notebook).name)


def get_spec(name: str, specs_dir: str | Path = SPECS_DIR) -> Spec:
    specs = {s.name: s for s in load_specs(specs_dir)}
    if name not in specs:
        raise KeyError(f"no spec {name!r}; valid: {', '.join(specs)}")
    return specs[name]


# ------------------------------------------------------------------------------------------------ runs


def run_complete(run_dir: Path) -> bool:
    """True when ``run_dir`` holds a finished tiny run (its metrics reach the configured last step)."""
    from rlkit.metrics import read_metrics

    config, metrics = run_dir / "config.json", run_dir / "metrics.jsonl"
    if not (config.exists() and metrics.exists()):
        return False
    records = read_metrics(metrics)
    return bool(records) and records[-1]["step"] >= json.loads(config.read_text())["steps"]


def ensure_run(
    method: str,
    *,
    scale: str = "cpu",
    seed: int = 0,
    results: str | Path = RESULTS_DIR,
    device: str = "cpu",
    overrides: dict[str, Any] | None = None,
    name: str | None = None,
    progress: bool = True,
) -> Run:
    """The tiny-engine run of ``method`` at ``<results>/<name or method>/seed<seed>``: reused when finished with the
    same config, resumed when killed part-way, trained otherwise. A finished run with another config is an error
    (delete it, or pass another ``name``)."""
    from rlkit.tiny.rl import build_config, train

    cfg = build_config(method, scale, {"seed": seed, **(overrides or {})})
    run_dir = Path(results) / (name or method) / f"seed{seed}"
    ckpt = run_dir / "checkpoint.pt"
    if run_complete(run_dir):
        saved = json.loads((run_dir / "config.json").read_text())
        wanted = json.loads(json.dumps(_asdict(cfg), default=list))
        if saved != wanted:
            changed = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
            raise ValueError(f"{run_dir} holds a finished run with another config ({', '.join(changed)} differ); "
                             "delete it or choose another name")
    else:
        train(cfg, run_dir, device=device, resume=ckpt.exists(), progress=progress)
    return load_run(run_dir)


def _asdict(cfg) -> dict:
    from dataclasses import asdict

    return asdict(cfg)


# ------------------------------------------------------------------------------------------------ claims


def _value(run: Run, claim: Claim) -> float:
    """Mean of the last ``window`` logged values of the claim's metric; for ``rise``, minus the first value."""
    values = run.frame[claim.metric].dropna() if claim.metric in run.frame else pd.Series(dtype=float)
    if values.empty:
        raise KeyError(f"{run.path}: metric {claim.metric!r} was never logged")
    tail = float(values.iloc[-claim.window :].mean())
    return tail - float(values.iloc[0]) if claim.expect == "rise" else tail


def judge(claim: Claim, runs: Sequence[Run], baseline: Sequence[Run] = ()) -> dict[str, Any]:
    """One claim against the runs of its method (and of its baseline, paired by seed): verdict and the numbers.

    Per seed the value is the mean of the last ``window`` logged values of the metric (``rise``: that minus the
    run's first value). ``rise`` and ``at_least`` hold when every seed's value exceeds ``tolerance``;
    ``lower``/``higher`` when every seed's difference to the baseline has the expected sign and the mean
    difference exceeds ``tolerance``; ``not_lower`` when the mean difference is ≥ −``tolerance``; ``equal`` when
    the mean |difference| is at most ``tolerance``.
    """
    row: dict[str, Any] = {"claim": claim.claim, "paper": claim.source, "metric": claim.metric or "—"}
    if claim.metric is None:
        return {**row, "ours": claim.reason, "verdict": VERDICTS[2]}
    if not runs:
        raise ValueError(f"no runs to judge {claim.claim!r}")
    ours = {r.seed: _value(r, claim) for r in runs}
    n = f"{len(ours)} seed{'s' if len(ours) > 1 else ''}"
    mean_ours = sum(ours.values()) / len(ours)
    if claim.expect in ("rise", "at_least"):
        ok = all(v > claim.tolerance for v in ours.values())
        text = f"{_fmt(mean_ours, True)} over the start" if claim.expect == "rise" else _fmt(mean_ours)
        return {**row, "ours": f"{text} ({n})", "verdict": VERDICTS[0 if ok else 1]}
    base = {r.seed: _value(r, claim) for r in baseline}
    seeds = [s for s in ours if s in base]
    if not seeds:
        raise ValueError(f"claim {claim.claim!r}: no {claim.baseline} run with the same seed to compare against")
    diffs = [ours[s] - base[s] for s in seeds]
    mean_diff = sum(diffs) / len(diffs)
    if claim.expect == "lower":
        ok = all(d < 0 for d in diffs) and -mean_diff > claim.tolerance
    elif claim.expect == "higher":
        ok = all(d > 0 for d in diffs) and mean_diff > claim.tolerance
    elif claim.expect == "not_lower":
        ok = mean_diff >= -claim.tolerance
    else:  # equal
        ok = abs(mean_diff) <= claim.tolerance
    mean_ours, mean_base = (sum(ours[s] for s in seeds) / len(seeds), sum(base[s] for s in seeds) / len(seeds))
    text = f"{_fmt(mean_ours)} vs {claim.baseline} {_fmt(mean_base)} ({n})"
    return {**row, "ours": text, "verdict": VERDICTS[0 if ok else 1]}


def _fmt(x: float, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{x:{sign}.3g}" if abs(x) < 10 else f"{x:{sign}.1f}"


def judge_claims(spec: Spec, results: str | Path = RESULTS_DIR, seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """The claims table of ``spec``: claim · paper · metric · ours · verdict, from the runs of ``seeds`` (default:
    the spec's) under ``results``. Seeds without a finished run are left out."""
    results = Path(results)
    seeds = list(range(spec.seeds)) if seeds is None else list(seeds)

    def runs_of(method: str) -> list[Run]:
        dirs = [results / method / f"seed{k}" for k in seeds]
        return [load_run(d) for d in dirs if (d / "metrics.jsonl").exists()]

    rows = [judge(c, runs_of(spec.method) if spec.method and c.metric else [],
                  runs_of(c.baseline) if c.metric else []) for c in spec.claims]
    return pd.DataFrame(rows, columns=["claim", "paper", "metric", "ours", "verdict"])


# ------------------------------------------------------------------------------------------------ execution


def notebook_node(path: str | Path):
    """A MyST-markdown notebook as an nbformat node (jupytext), ready for papermill."""
    import jupytext

    return jupytext.read(Path(path), fmt="md:myst")  # explicit: a header without format_version still reads as MyST


def execute(spec: Spec, out_dir: Path, parameters: dict[str, Any], *, progress: bool = True) -> Path:
    """Execute ``spec``'s notebook with ``parameters`` into ``out_dir/<stem>.ipynb``; raise on the first failing cell
    with the cell's source and the error (:class:`NotebookFailed`)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    if not (REPO / spec.notebook).exists():
        raise FileNotFoundError(f"spec {spec.name!r}: notebook {spec.notebook} does not exist")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / f"{Path(spec.notebook).stem}.ipynb"
    try:
        papermill.execute_notebook(
            notebook_node(REPO / spec.notebook), str(output), parameters=parameters, cwd=str(REPO),
            kernel_name="python3", progress_bar=progress, request_save_on_cell_execute=True,
        )
    except PapermillExecutionError as e:
        raise NotebookFailed(spec.notebook, output, e.exec_count, e.source, e.ename, e.evalue) from None
    return output


class NotebookFailed(RuntimeError):
    """A notebook cell raised: which notebook, which cell, what error, and where the partial output is."""

    def __init__(self, notebook: str, output: Path, cell: int, source: str, ename: str, evalue: str):
        self.notebook, self.output, self.cell, self.source, self.ename, self.evalue = (
            notebook, output, cell, source, ename, evalue)
        indented = "\n".join("    " + line for line in source.splitlines())
        super().__init__(f"{notebook} failed in cell [{cell}]:\n{indented}\n{ename}: {evalue}\n"
                         f"(executed notebook with the traceback: {output})")


def reproduce(
    *,
    only: Sequence[str] | None = None,
    scale: str | None = None,
    seeds: int | None = None,
    results: str | Path = RESULTS_DIR,
    device: str = "cpu",
    specs_dir: str | Path = SPECS_DIR,
    progress: bool = True,
) -> dict[str, Any]:
    """Execute the specs (``only``: these names) at ``scale`` (default: each spec's) with ``seeds`` seeds; returns
    ``{"notebooks": [paths], "minutes": {name: m}}``. A failing notebook raises :class:`NotebookFailed`."""
    specs = load_specs(specs_dir)
    if only:
        names = {s.name for s in specs}
        unknown = sorted(set(only) - names)
        if unknown:
            raise KeyError(f"unknown reproductions {unknown}; valid: {', '.join(sorted(names))}")
        specs = [s for s in specs if s.name in only]
    results = Path(results).resolve()
    # notebooks run with the repository as working directory: a path inside it is shown relative, as on the CLI
    shown = results.relative_to(REPO) if results.is_relative_to(REPO) else results
    done: list[Path] = []
    minutes: dict[str, float] = {}
    jobs = [(s, d, k) for s in specs for k, d in enumerate(s.run_dirs(results, seeds))]
    for i, (spec, out_dir, k) in enumerate(jobs, 1):
        params = {"scale": scale or spec.scale, "results": str(shown), "device": device, "progress": False,
                  **spec.parameters}
        params.update({"seed": k} if spec.method else {"seeds": seeds or spec.seeds})
        what = f"{spec.name}" + (f" seed {k}" if spec.method else "")
        print(f"[{i}/{len(jobs)}] {what}: {spec.notebook} at {params['scale']} scale", flush=True)
        t0 = time.perf_counter()
        done.append(execute(spec, out_dir, params, progress=progress))
        minutes[what] = (time.perf_counter() - t0) / 60
        print(f"[{i}/{len(jobs)}] {what}: done in {minutes[what]:.1f} min -> {done[-1]}", flush=True)
    return {"notebooks": done, "minutes": minutes}
