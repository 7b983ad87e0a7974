"""Run metrics as JSON lines ``{"step": N, "data": {...}}``, verl's ``file`` logger format (one reader for both).
Crash-safe: each line is fsynced before the step counts as done, a reader skips a torn last line, and
:meth:`MetricsWriter.open` with ``resume_after=k`` drops the lines past step ``k``, so a killed-and-resumed run ends
with the lines of an uninterrupted one. Non-finite numbers are written as ``null`` (as verl's orjson) and read as NaN.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from rlkit.errors import DamagedFile
from rlkit.files import atomic_write


def _clean(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _parse(lines: Iterable[str], path: Path, *, whole: bool = False) -> list[dict[str, Any]]:
    records, lines = [], list(lines)
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) - 1 and not whole:  # torn last line: the writer was killed mid-write
                warnings.warn(f"{path}: ignoring a truncated last line", stacklevel=3)
                break
            what = ("the last line is cut off (a writer killed mid-line, or a truncated file)" if n == len(lines) - 1
                    else "not a JSON line")
            raise DamagedFile(f"{path}:{n + 1}: {what}") from None
        if not isinstance(rec, dict) or not _is_step(rec.get("step")) or not isinstance(rec.get("data"), dict):
            raise DamagedFile(f'{path}:{n + 1}: expected {{"step": N, "data": {{...}}}}')
        rec["data"] = {k: (math.nan if v is None else v) for k, v in rec["data"].items()}
        records.append(rec)
    return records


def _is_step(step: Any) -> bool:
    return isinstance(step, int) and not isinstance(step, bool)


def read_metrics(path: str | Path, *, whole: bool = False) -> list[dict[str, Any]]:
    """A metrics file's records in file order; a bad line is :class:`~rlkit.errors.DamagedFile` naming it, a cut-off
    last line is skipped with a warning unless ``whole`` (a finished run's file: damaged)."""
    path = Path(path)
    return _parse(path.read_text(encoding="utf-8", errors="replace").split("\n"), path, whole=whole)


def metrics_frame(path: str | Path) -> pd.DataFrame:
    """A metrics file as a DataFrame indexed by step, one column per metric (a step logged twice: last wins)."""
    records = read_metrics(path)
    frame = pd.DataFrame([r["data"] for r in records], index=pd.Index([r["step"] for r in records], name="step"))
    return frame[~frame.index.duplicated(keep="last")]


class MetricsWriter:
    """Append-only, fsynced writer of one run's ``metrics.jsonl``. Use :meth:`open`."""

    def __init__(self, path: Path, fp) -> None:
        self.path, self._fp = path, fp

    @classmethod
    def open(cls, path: str | Path, *, resume_after: int | None = None) -> MetricsWriter:
        """A fresh file (``resume_after=None``), or the existing one truncated to the lines with step ≤ ``resume_after``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_after is None or not path.exists():
            return cls(path, path.open("w", encoding="utf-8"))
        with path.open(encoding="utf-8") as f:
            kept = [r for r in _parse(f.read().split("\n"), path) if r["step"] <= resume_after]
        with atomic_write(path) as f:
            f.writelines(_dumps(r["step"], r["data"]) for r in kept)
        return cls(path, path.open("a", encoding="utf-8"))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Write one step's metrics and make it durable before returning."""
        self._fp.write(_dumps(step, data))
        self._fp.flush()
        os.fsync(self._fp.fileno())

    def close(self) -> None:
        self._fp.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dumps(step: int, data: Mapping[str, Any]) -> str:
    if not _is_step(step):
        raise ValueError(f"step must be an int, got {step!r}")
    return json.dumps({"step": step, "data": {k: _clean(v) for k, v in data.items()}}, allow_nan=False) + "\n"
