"""What a learner reads to follow GSPO from its equation to the optimizer step (benchmarks/read_path.py): at most
5 files and 1,200 lines, and README.md says what it measures."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import load_benchmark

REPO = Path(__file__).resolve().parents[1]


def test_gspo_is_read_in_at_most_5_files_and_1200_lines_as_readme_says():
    bench = load_benchmark("read_path")
    path = bench.read_path("gspo")
    assert {"methods/gspo.py", "methods/grpo.py", "core/ops.py", "tiny/step.py"} <= set(path)
    functions = sum(sum(f.values()) for f in path.values())
    whole = sum(len((bench.PACKAGE / name).read_text().splitlines()) for name in path)
    assert len(path) <= 5 and whole <= 1200, (len(path), whole, sorted(path))
    readme = " ".join((REPO / "README.md").read_text().split())
    said = re.search(r"reads (\d+) files — .*? — ([\d,]+) lines of the functions a GSPO run calls there, ([\d,]+) "
                     r"lines in those files", readme)
    assert said, "README's 'Reading one method end to end' no longer states the read path"
    assert [int(g.replace(",", "")) for g in said.groups()] == [len(path), functions, whole]
