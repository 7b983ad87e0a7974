"""Metrics files: verl's line format, torn lines, resume truncation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from rlkit.metrics import MetricsWriter, metrics_frame, read_metrics


def test_lines_are_verls_format_and_round_trip(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with MetricsWriter.open(path) as w:
        w.log({"critic/score/mean": 0.5, "actor/entropy": torch.tensor(1.25), "n": np.int64(3)}, step=0)
        w.log({"critic/score/mean": float("nan"), "val/acc": 0.75}, step=1)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 0, "data": {"critic/score/mean": 0.5, "actor/entropy": 1.25, "n": 3}}
    assert json.loads(lines[1])["data"]["critic/score/mean"] is None  # JSON has no NaN: null, as verl writes
    recs = read_metrics(path)
    assert math.isnan(recs[1]["data"]["critic/score/mean"])
    frame = metrics_frame(path)
    assert list(frame.index) == [0, 1] and frame.loc[1, "val/acc"] == 0.75 and math.isnan(frame.loc[0, "val/acc"])


def test_torn_last_line_is_skipped_with_a_warning_but_a_bad_middle_line_fails(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "data": {"a": 1}}\n{"step": 1, "da')
    with pytest.warns(UserWarning, match="truncated last line"):
        assert [r["step"] for r in read_metrics(path)] == [0]
    path.write_text('{"step": 0, "data": {"a": 1}}\nnot json\n{"step": 2, "data": {}}\n')
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        read_metrics(path)
    path.write_text('{"step": 0}\n')
    with pytest.raises(ValueError, match="expected"):
        read_metrics(path)


def test_resume_drops_the_steps_to_be_redone_and_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter.open(path) as w:
        for step in range(5):
            w.log({"x": step}, step)
    with path.open("a") as f:
        f.write('{"step": 5, "data": {"x"')  # killed mid-write
    with pytest.warns(UserWarning):
        w = MetricsWriter.open(path, resume_after=2)  # checkpoint at step 2: steps 3, 4, 5 are redone
    for step in range(3, 6):
        w.log({"x": step}, step)
    w.close()
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2, 3, 4, 5]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_step_must_be_an_int(tmp_path):
    with MetricsWriter.open(tmp_path / "m.jsonl") as w, pytest.raises(ValueError, match="step must be an int"):
        w.log({"a": 1}, step=1.5)
