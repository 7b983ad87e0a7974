"""The run files as the lab reads them: a run directory's metrics, config, environment; which seeds ended."""

from __future__ import annotations

import json
import warnings
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rlkit.errors import DamagedFile
from rlkit.files import read_json
from rlkit.metrics import metrics_frame, read_metrics

X_AXES = {"step": "RL step", "tokens": "response tokens sampled (thousands)",
          "minutes": "wall time of the RL stage (minutes)"}
"""The x axes a run's series can be read against (:meth:`Run.series`), with their labels."""
SHARES = ("val/acc", "val/acc_final", "sft/val_acc", "critic/score/mean", "policy/score/mean",
          "critic/rewards/mean", "adv/zero_frac", "tool/code_ratio", "tool/correct_code_ratio")
"""Metrics that are shares of responses or problems: their panels span 0 to 1, differences are in points."""


@dataclass
class Run:
    """One run: its metrics (a DataFrame indexed by step) and, when present, its config and environment."""

    path: Path
    frame: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def method(self) -> str:
        """The method (config.json's; else the directory's name, its parent's for seed<k>)."""
        if "method" in self.config:
            return str(self.config["method"])
        name = self.path.name
        return self.path.parent.name if name.startswith("seed") else name

    @property
    def label(self) -> str:
        """What legends call the run: its directory's name when it names a variant, else the method."""
        name = self.path.parent.name if self.path.name.startswith("seed") else self.path.name
        return name if name.startswith(self.method) else self.method

    @property
    def seed(self) -> int | None:
        return self.config.get("seed", self.env.get("seed"))

    @property
    def minutes(self) -> float:
        """Wall time of the RL stage: every step plus the method's own set-up (an offline pass)."""
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
            logged = ", ".join(sorted(self.frame.columns))
            raise KeyError(f"{self.path}: no metric {metric!r}; logged: {logged}")
        values = self.frame[metric]
        if x == "step":
            axis = self.frame.index.to_series()
        elif x == "tokens":
            axis = self._cumulative("rollout/response_tokens") / 1e3
        else:  # the method's own set-up (its offline pass, logged at step 0) counts as time spent
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
    """The run in directory ``path`` (or of ``metrics.jsonl`` ``path``); damaged files raise DamagedFile."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    metrics = path / "metrics.jsonl"
    if not metrics.exists():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (is it a run directory?)")
    extra = {name: read_json(path / f"{name}.json") if (path / f"{name}.json").exists() else {}
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


def final_correct(run: Run) -> np.ndarray | None:
    """Per held-out problem, 1/0 at the last greedy evaluation (``eval.jsonl``), or None if not saved."""
    path = Path(run.path) / "eval.jsonl"
    check_finished(run.path)  # a damaged one named, never read as a run that saved none
    records = read_metrics(path) if path.exists() else []
    return np.asarray(records[-1]["data"]["correct"], dtype=float) if records else None


FIRST_SEED = 100
"""The first seed of the runs a reproduction plans, unused by the publication of 2026-11-28 (issue 46)."""


def seed_numbers(n: int, first: int = FIRST_SEED) -> list[int]:
    """The first ``n`` seeds of a run group whose seeds begin at ``first``."""
    return list(range(first, first + n))


def first_seed(results: str | Path) -> int:
    """The lowest seed of the runs under ``results`` (``<group>/seed<k>/``), or :data:`FIRST_SEED` if none."""
    found = [int(p.name[4:]) for p in Path(results).glob("*/seed*") if p.name[4:].isdigit() and p.is_dir()]
    return min(found, default=FIRST_SEED)


def available_seeds(results: str | Path, name: str, cap: int | None = None) -> list[int]:
    """The finished seeds of run ``name`` under ``results``, consecutive from :func:`first_seed`."""
    first = first_seed(results)
    out: list[int] = []
    while finished(Path(results) / name / f"seed{first + len(out)}") and (cap is None or len(out) < cap):
        out.append(first + len(out))
    return out


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run whose metrics reach its last step; damaged files are refused, named."""
    config, metrics = run_dir / "config.json", run_dir / "metrics.jsonl"
    return config.exists() and metrics.exists() and check_finished(run_dir)


def check_finished(run_dir: str | Path, *, checkpoint: bool | None = None) -> bool:
    """Whether the run in ``run_dir`` finished, every file it has whole (else
    :class:`~rlkit.errors.DamagedFile`); ``checkpoint``: True must be whole, None checked if present."""
    run_dir = Path(run_dir)
    try:
        return _check(run_dir, checkpoint)
    except DamagedFile as e:
        raise DamagedFile(f"{e}: restore it, or delete {run_dir} to train the run again") from None


def _check(run_dir: Path, checkpoint: bool | None) -> bool:
    config = read_json(run_dir / "config.json")
    steps = whole_number(config, "steps", run_dir / "config.json", least=0)
    tiny = "final_eval_size" in config
    if tiny:
        whole_number(config, "final_eval_size", run_dir / "config.json")
    if tiny or (run_dir / "env.json").exists():
        read_json(run_dir / "env.json")
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        raise DamagedFile(f"{metrics} is missing")
    with warnings.catch_warnings():  # a torn last line: a run killed while writing it, not finished
        warnings.simplefilter("ignore")
        records = read_metrics(metrics)
    ended = bool(records) and records[-1]["step"] >= steps
    if ended:
        read_metrics(metrics, whole=True)
    per_problem = run_dir / "eval.jsonl"
    if per_problem.exists() or (tiny and ended):
        _check_per_problem(per_problem, ended)
    ckpt = run_dir / "checkpoint.pt"
    if checkpoint or (checkpoint is None and ckpt.exists()):
        _check_zip(ckpt)
    return ended


def whole_number(config: dict[str, Any], key: str, path: Path, least: int = 1) -> int:
    """``config[key]``, a whole number ≥ ``least``, or :class:`~rlkit.errors.DamagedFile` naming ``path``."""
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise DamagedFile(f"{path}: {key} is {json.dumps(value)}, not a whole number ≥ {least}")
    return value


def _check_per_problem(path: Path, ended: bool) -> None:
    if not path.exists():
        raise DamagedFile(f"{path} is missing (the final evaluation's result per held-out problem)")
    records = read_metrics(path, whole=ended)
    if ended and not records:
        raise DamagedFile(f"{path} is empty: it holds no final evaluation")
    for n, record in enumerate(records, 1):
        correct = record["data"].get("correct")
        if not isinstance(correct, list) or not all(type(v) in (int, bool) and v in (0, 1) for v in correct):
            raise DamagedFile(f"{path}:{n}: correct is not a list of 0/1, one per held-out problem")


def _check_zip(path: Path) -> None:
    """``path`` is a whole ``torch.save`` file (a zip archive whose directory, written last, is there)."""
    if not path.exists():
        raise DamagedFile(f"{path} is missing (the run's final checkpoint)")
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise DamagedFile(f"{path} is damaged (not a whole torch checkpoint: {e})") from None
