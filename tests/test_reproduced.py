"""Did I reproduce? (rlkit/lab/reproduced.py): bit-identical, within the published spread, outside it, per run; verdicts
per claim; both machines named."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest

from rlkit.lab import paths, reproduced
from rlkit.lab.claims import compared_runs
from rlkit.lab.reproduce import get_spec
from rlkit.tiny.config import build_config
from rlkit.tiny.rl import train

PUBLISHED_DIR = paths.published_dir()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """Three smoke-scale seeds of GRPO, as a 'published' folder."""
    root = tmp_path_factory.mktemp("published")
    cache = tmp_path_factory.mktemp("sft")
    for seed in range(3):
        run = train(build_config("grpo", "smoke", {"seed": seed, "final_eval_size": 200}),
                    root / "grpo" / f"seed{seed}", progress=False, sft_cache=cache)
        _set_final(run, [0.50, 0.52, 0.51][seed])  # a spread to judge against (the smoke model scores ~0)
    return root


def _set_final(run_dir, value):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["data"]["val/acc_final"] = value
    (run_dir / "metrics.jsonl").write_text("\n".join(lines[:-1] + [json.dumps(last)]) + "\n")


def test_spread_band_hand_case():
    low, high = reproduced.spread_band([0.50, 0.52, 0.51], 1000)
    half = 1.96 * (0.51 * 0.49 / 1000) ** 0.5  # 0.0310
    assert low == pytest.approx(0.50 - half) and high == pytest.approx(0.52 + half)


def test_each_status_is_told_apart(published, tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(published, mine)
    seeds = reproduced.compare_runs(mine, published)
    assert set(seeds["status"]) == {reproduced.IDENTICAL}
    # timings differ on every machine: still bit-identical
    lines = (mine / "grpo/seed0/metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[1])
    first["data"]["timing_s/step"] += 1.0
    (mine / "grpo/seed0/metrics.jsonl").write_text("\n".join([lines[0], json.dumps(first), *lines[2:]]) + "\n")
    # seed 1 moved a little, seed 2 far; one run missing
    # band: [0.50, 0.52] ± 1.96·√(0.51·0.49/200) = [0.431, 0.589]
    _set_final(mine / "grpo/seed1", 0.44)
    _set_final(mine / "grpo/seed2", 0.42)
    rows = reproduced.compare_runs(mine, published).set_index("seed")["status"]
    assert rows[0] == reproduced.IDENTICAL
    assert rows[1] == reproduced.WITHIN
    assert rows[2] == reproduced.OUTSIDE
    shutil.rmtree(mine / "grpo/seed2")
    assert reproduced.compare_runs(mine, published).set_index("seed")["status"][2] == reproduced.MISSING


def test_a_changed_per_problem_result_is_not_bit_identical(published, tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(published, mine)
    path = mine / "grpo/seed0/eval.jsonl"
    rec = json.loads(path.read_text().splitlines()[-1])
    rec["data"]["correct"][0] = 1 - rec["data"]["correct"][0]
    path.write_text(json.dumps(rec) + "\n")
    assert not reproduced.identical(mine / "grpo/seed0", published / "grpo/seed0")


def test_the_report_names_both_machines_and_the_claims_that_moved(published, tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(published, mine)
    out = reproduced.report(mine, published, specs=[])
    text = (mine / "reproduced.md").read_text()
    env = json.loads((published / "grpo/seed0/env.json").read_text())
    assert env["fingerprint"] in text and env["processor"] in text
    assert "Same fingerprint" in text and out["counts"] == {reproduced.IDENTICAL: 3}
    assert json.loads((mine / "reproduced.json").read_text())["counts"] == out["counts"]


@pytest.mark.skipif(not (PUBLISHED_DIR / "grpo").is_dir(), reason="the published results are not in this checkout")
def test_claims_are_judged_on_both_sides_by_the_same_rules(tmp_path):
    spec = get_spec("grpo")  # its claims the published runs can judge
    spec = dataclasses.replace(spec, claims=[c for c in spec.claims if not c.judged or all(
        (PUBLISHED_DIR / n).is_dir() for n in compared_runs(c, spec))])
    assert sum(c.judged for c in spec.claims) >= 2
    mine = tmp_path / "mine"
    for name in {spec.method} | {n for c in spec.claims if c.judged for n in compared_runs(c, spec)}:
        shutil.copytree(PUBLISHED_DIR / name, mine / name)  # every run a kept claim compares (grpo-4: a rung's)
    same = reproduced.compare_claims(mine, PUBLISHED_DIR, [spec])
    assert len(same) and same["same"].all()
    # nearly every GRPO sample in a zero-advantage group, in every seed: "most samples carry no gradient" must flip
    for seed_dir in (mine / "grpo").glob("seed*"):
        recs = [json.loads(line) for line in (seed_dir / "metrics.jsonl").read_text().splitlines()]
        for r in recs:
            if "adv/zero_frac" in r["data"]:
                r["data"]["adv/zero_frac"] = 0.99
        (seed_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    moved = reproduced.compare_claims(mine, PUBLISHED_DIR, [spec])
    assert not moved["same"].all()


def test_a_last_bit_apart_mean_is_the_same_run_not_another(published, tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(published, mine)
    path = mine / "grpo/seed0/metrics.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[1])
    key = next(k for k, v in rec["data"].items() if isinstance(v, float) and v and not k.startswith("timing"))
    rec["data"][key] = math.nextafter(rec["data"][key], math.inf)  # one ulp: another rounding of the same mean
    path.write_text("\n".join([lines[0], json.dumps(rec), *lines[2:]]) + "\n")
    assert reproduced.compare_runs(mine, published).set_index("seed")["status"][0] == reproduced.SAME_RUN
    rec["data"][key] = rec["data"][key] * (1 + 1e-6)
    path.write_text("\n".join([lines[0], json.dumps(rec), *lines[2:]]) + "\n")
    assert reproduced.compare_runs(mine, published).set_index("seed")["status"][0] != reproduced.SAME_RUN
