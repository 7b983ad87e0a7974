"""Reproduction plumbing without notebooks: specs, the claim rules, ensure_run (reuse / resume / refuse), plots."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib
import pytest
import torch

from conftest import default_sigint
from rlkit.lab import plots
from rlkit.metrics import MetricsWriter, read_metrics
from rlkit.lab.reproduce import Spec, ensure_run, load_specs
from rlkit.lab.runs import finished, load_run, load_runs

matplotlib.use("Agg")


def fake_run(root: Path, method: str, seed: int, series: dict[str, list[float]], steps: int | None = None) -> Path:
    """A run directory with metrics ``series`` (one value per step from 0; None = not logged that step)."""
    run = root / method / f"seed{seed}"
    n = max(len(v) for v in series.values())
    with MetricsWriter.open(run / "metrics.jsonl") as w:
        for step in range(n):
            w.log({k: v[step] for k, v in series.items() if step < len(v) and v[step] is not None}, step)
    (run / "config.json").write_text(json.dumps({"method": method, "seed": seed, "steps": steps or n - 1}))
    return run


def test_every_spec_loads_and_names_its_notebook():
    specs = load_specs()
    files = sorted(p.stem for p in (Path(__file__).parent.parent / "reproductions" / "specs").glob("*.yaml"))
    assert sorted(s.name for s in specs) == files  # one spec a file, named as its file
    notebooks = [s.notebook for s in specs]
    assert notebooks == sorted(notebooks) and len(set(notebooks)) == len(notebooks)  # in notebook order, one each
    from rlkit.lab.notebook import anatomy_table

    table = anatomy_table().splitlines()  # the overview's: every method spec gives its row
    assert len(table) == 2 + sum(s.method_page for s in specs) and "**GRPO** (baseline)" in table[2]
    for s in specs:
        assert (Path(__file__).parent.parent / s.notebook).exists(), s.notebook
        if s.method:
            assert s.claims and any(c.metric for c in s.claims), f"{s.name} tests no claim"


def test_spec_errors_name_the_file_and_the_key(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("name: x\nnotebook: notebooks/01_grpo.md\nsedes: 3\n")
    with pytest.raises(ValueError, match=r"x.yaml: unknown keys \['sedes'\]"):
        Spec.load(bad)
    bad.write_text("name: x\nclaims: [a: b: c]\n")
    with pytest.raises(ValueError, match="x.yaml: not valid YAML"):
        Spec.load(bad)


@pytest.mark.parametrize(("body", "error"), [
    ("seeds: 0", "seeds must be an integer ≥ 1"),
    ("regimes: [standard, hot]", r"unknown regimes \['hot'\]; valid: standard, papers-4, async-2, async-4, stress"),
    ("variants: {x-big: {stepz: 3}}", "RLConfig has no field 'stepz'"),
    ("claims: [{claim: c, source: s, metric: gspo/seq_ratio/max, expect: higher, activity: {metric: aspo/shaped_frac, at_least: 0.01}}]",
     "metric 'gspo/seq_ratio/max' is not logged by aspo runs"),
    ("claims: [{claim: c, source: s, metric: val/acc, expect: higher}]",
     "claim 'c': a judged claim needs an activity metric"),
    ("claims: [{claim: c, source: s, metric: policy/entropy, expect: higher, activity: {metric: aspo/shaped_frac, at_least: 0.01}}]",
     r"metric 'policy/entropy' is not logged by aspo runs \(standard regime\)"),
    ("regimes: [standard, stress]\nclaims: [{claim: c, source: s, metric: policy/entropy, expect: higher, regime: stress,"
     " window: 11, activity: {metric: aspo/shaped_frac, at_least: 0.01}}]",
     r"reads the last 11 values of 'policy/entropy', logged at every step of a stress run's last 10 only"),
    ("claims: [{claim: c, source: s, metric: actor/entropy, expect: higher, without: [spo],"
     " activity: {metric: hapo/clip_low/mean, at_least: 0.1}}]", "'hapo/clip_low/mean' is not logged by aspo"),
    ("claims: [{claim: c, source: s, run: aspo-eq9, metric: val/acc, expect: higher, activity: {metric: aspo/shaped_frac, at_least: 0.01}}]",
     "run 'aspo-eq9' is not one of this spec's runs"),
    ("claims: [{claim: c, source: s, metric: val/acc, expect: higher, regime: hot, activity: {metric: aspo/shaped_frac, at_least: 0.01}}]", "regime must be one of"),
])
def test_a_spec_that_cannot_be_judged_fails_when_it_loads(tmp_path, body, error):
    bad = tmp_path / "x.yaml"
    bad.write_text(f"name: x\nnotebook: notebooks/03_aspo.md\nmethod: aspo\n{body}\n")
    with pytest.raises(ValueError, match=error):
        Spec.load(bad)


def test_a_spec_plans_every_run_of_every_regime_variant_and_seed():
    spec = Spec(name="x", notebook="n.md", method="gspo", seeds=2, regimes=["standard", "stress"],
                variants={"gspo-token": {"gspo.variant": "token"}})
    runs = spec.runs()
    assert [(p.name, p.regime, p.seed) for p in runs] == [  # the seeds of a publication: from FIRST_SEED
        ("gspo", "standard", 100), ("gspo", "standard", 101), ("gspo-stress", "stress", 100),
        ("gspo-stress", "stress", 101), ("gspo-token", "standard", 100), ("gspo-token", "standard", 101)]
    assert runs[-1].overrides == (("gspo.variant", "token"),)
    assert len(spec.runs(seeds=3)) == 9
    # variants in other regimes than the standard one: <variant>-<regime>
    both = Spec(name="x", notebook="n.md", method="grpo", seeds=1, variants={"grpo-decoupled": {"decoupled_loss": True}},
                variant_regimes=["standard", "async-4"])
    assert [(p.name, p.regime) for p in both.runs()] == [
        ("grpo", "standard"), ("grpo-decoupled", "standard"), ("grpo-decoupled-async-4", "async-4")]
    with pytest.raises(ValueError, match="unknown regimes"):
        Spec(name="x", notebook="n.md", method="grpo", variants={"v": {}}, variant_regimes=["hot"])


def test_train_runs_side_by_side_then_reuses_them(tmp_path, monkeypatch):
    from rlkit.lab.reproduce import PlannedRun, train_runs

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    plan = [PlannedRun("grpo", "grpo", "standard", 0), PlannedRun("gspo-stress", "gspo", "stress", 1),
            PlannedRun("spo-x", "spo", "standard", 0, (("spo.no_baseline", True),))]
    minutes = train_runs(plan, scale="smoke", results=tmp_path, workers=2, progress=False)
    assert set(minutes) == {"grpo seed 0", "gspo-stress seed 1", "spo-x seed 0"}
    for p in plan:
        run = tmp_path / p.name / f"seed{p.seed}"
        assert finished(run)
        config = json.loads((run / "config.json").read_text())
        assert config["method"] == p.method and config["seed"] == p.seed
    assert json.loads((tmp_path / "gspo-stress/seed1/config.json").read_text())["staleness"] > 0
    assert json.loads((tmp_path / "spo-x/seed0/config.json").read_text())["spo"]["no_baseline"] is True
    assert train_runs(plan, scale="smoke", results=tmp_path, progress=False) == {}  # all finished: reused


def test_train_runs_progress_moves_as_each_run_ends(tmp_path, monkeypatch):
    """Three runs on two workers: the first to end is counted before the third (started after it) ends."""
    import time

    import rlkit.lab.reproduce as reproduce

    updates = []

    class Bar:
        def __init__(self, *a, **k):
            pass

        def update(self, n=1):
            updates.append(time.time())

        def set_postfix_str(self, s="", refresh=True):  # the estimated time left
            pass

        def close(self):
            pass

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("tqdm.auto.tqdm", Bar)
    plan = [reproduce.PlannedRun("grpo", "grpo", "standard", k) for k in range(3)]
    reproduce.train_runs(plan, scale="smoke", results=tmp_path, workers=2, progress=True)
    ended = sorted((tmp_path / "grpo" / f"seed{k}" / "metrics.jsonl").stat().st_mtime for k in range(3))
    assert len(updates) == 3
    assert updates[0] < ended[-1], "the bar counted no run before the last one ended"


# ------------------------------------------------------------------------------------------------ runs


def test_ensure_run_trains_reuses_and_refuses_another_config(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    run = ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 2})
    assert finished(run.path) and [r["step"] for r in read_metrics(run.path / "metrics.jsonl")] == [0, 1, 2]
    stamp = (run.path / "metrics.jsonl").stat().st_mtime_ns
    again = ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 2})
    assert (again.path / "metrics.jsonl").stat().st_mtime_ns == stamp  # reused, not retrained
    with pytest.raises(ValueError, match="steps differ"):
        ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 3})
    # a method registered after the run was trained: its section is on one side only, which resuming allows too;
    # a setting of the engine the run lacks is a difference
    config = run.path / "config.json"
    saved = json.loads(config.read_text())
    config.write_text(json.dumps({k: v for k, v in saved.items() if k != "cispo"}))
    assert ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False,
                      overrides={"steps": 2}).path == run.path
    assert (run.path / "metrics.jsonl").stat().st_mtime_ns == stamp
    config.write_text(json.dumps({k: v for k, v in saved.items() if k != "grad_clip"}))
    with pytest.raises(ValueError, match="grad_clip differ"):
        ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 2})


def test_ensure_run_resumes_a_killed_run(tmp_path, monkeypatch):
    from rlkit.tiny.config import build_config
    from rlkit.tiny.rl import train

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    cfg = build_config("grpo", "smoke", {"steps": 3})
    train(cfg, tmp_path / "grpo" / "seed0", progress=False, stop_after=1)  # as if killed after step 1
    assert not finished(tmp_path / "grpo" / "seed0")
    run = ensure_run("grpo", scale="smoke", seed=0, results=tmp_path, progress=False, overrides={"steps": 3})
    assert [r["step"] for r in read_metrics(run.path / "metrics.jsonl")] == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------------ plots


def test_curves_draw_every_method_with_a_caption(tmp_path):
    for m in ("grpo", "aspo"):
        for s in (0, 1):
            fake_run(tmp_path, m, s, {"val/acc": [0.1, None, 0.3], "timing_s/step": [None, 2.0, 2.0],
                                      "rollout/response_tokens": [None, 100, 120]})
    runs = load_runs([tmp_path])
    assert [r.method for r in runs].count("aspo") == 2
    fig = plots.curves(runs, ["val/acc"], x="minutes")
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["aspo (2 seeds)", "grpo (2 seeds)"]
    assert list(ax.get_lines()[0].get_xdata()) == [0.0, 4.0 / 60]  # cumulative minutes at steps 0 and 2
    assert "seeds 0, 1" in fig.texts[0].get_text()
    assert plots.save(fig, tmp_path / "f" / "a.png").stat().st_size > 1000
    assert runs[0].response_tokens == 220 and runs[0].minutes == pytest.approx(4 / 60)


def test_variants_of_one_method_are_told_apart_by_line_style_and_marker(tmp_path):
    for name in ("hapo", "hapo-only-a", "hapo-only-b", "grpo-stress"):
        run = fake_run(tmp_path, name, 0, {"val/acc": [0.1, 0.2]})
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "method": name.split("-")[0]}))
    fig = plots.curves(load_runs([tmp_path]), ["val/acc"])
    lines = {line.get_label().split(" (")[0]: line for line in fig.axes[0].get_lines()}
    assert lines["hapo"].get_linestyle() == "-" and lines["hapo"].get_color() == plots.method_color("hapo")
    looks = {(lines[n].get_linestyle(), lines[n].get_marker()) for n in ("hapo", "hapo-only-a", "hapo-only-b")}
    assert len(looks) == 3, "two lines of one colour look the same"
    assert lines["grpo-stress"].get_linestyle() == "--"  # a method's only variant: dashed, as before
    own = plots.curves(load_runs([tmp_path]), ["val/acc"], colors={"hapo-only-a": "#0072B2"})
    colours = {line.get_label().split(" (")[0]: line.get_color() for line in own.axes[0].get_lines()}
    # a topic page's own colour for one variant; the other keeps its method's
    assert colours["hapo-only-a"] == "#0072B2" and colours["hapo-only-b"] == plots.method_color("hapo")


def test_panels_do_not_turn_noise_into_trends(tmp_path):
    fake_run(tmp_path, "grpo", 0, {"val/acc": [0.3, 0.35], "m": [0.1988, 0.2000]})
    fig = plots.curves(load_runs([tmp_path]), ["val/acc", "m"])
    share, other = fig.axes[:2]
    assert share.get_ylim() == (0.0, 1.0)  # a share spans 0..1
    low, high = other.get_ylim()
    assert high - low >= plots.MIN_SPAN * 0.2 * 0.999  # a 0.6% wiggle is drawn within a 2% span: flat
    assert other.yaxis.get_major_formatter().get_useOffset() is False


def test_an_ablation_dot_plot_has_a_row_per_run_and_a_dot_per_seed(tmp_path):
    for name, acc in (("hapo", [0.5, 0.52]), ("hapo-only-a", [0.48, 0.5]), ("grpo", [0.47, 0.49])):
        for seed, value in enumerate(acc):
            run = fake_run(tmp_path, name, seed, {"val/acc_final": [None, value]})
            config = json.loads((run / "config.json").read_text())
            (run / "config.json").write_text(json.dumps({**config, "method": name.split("-")[0]}))
    groups = plots.by_method(load_runs([tmp_path]))
    fig = plots.final_dots(groups)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(reversed(list(groups)))
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert sorted(x for line in dots for x in line.get_xdata()) == [0.47, 0.48, 0.49, 0.5, 0.5, 0.52]
    assert {line.get_color() for line in dots} == {plots.method_color(m) for m in ("hapo", "grpo")}


def test_a_published_run_without_its_checkpoint_says_why_and_what_to_run(tmp_path):
    from rlkit.errors import DamagedFile
    from rlkit.lab.notebook import final_state

    run = load_run(fake_run(tmp_path, "spo", 0, {"val/acc": [0.1, 0.2]}))
    with pytest.raises(FileNotFoundError, match="checkpoints are not committed.*rlkit reproduce --only"):
        final_state(run)
    torch.save({"tracker": {"alpha": 1.0}}, run.path / "checkpoint.pt")
    assert final_state(run)["tracker"] == {"alpha": 1.0}
    (run.path / "checkpoint.pt").write_bytes(b"garbage")  # damaged: named, not a pickle traceback
    with pytest.raises(DamagedFile, match="checkpoint.pt"):
        final_state(run)


def test_seed_band_spans_the_seeds(tmp_path):
    a = load_run(fake_run(tmp_path, "x", 0, {"m": [0.0, 1.0]}))
    b = load_run(fake_run(tmp_path, "x", 1, {"m": [0.0, 3.0]}))
    band = plots.seed_band([a, b], "m")
    assert list(band["mean"]) == [0.0, 2.0] and list(band["low"]) == [0.0, 1.0] and list(band["high"]) == [0.0, 3.0]


def test_plot_errors_are_clear(tmp_path):
    run = load_run(fake_run(tmp_path, "x", 0, {"m": [1.0]}))
    with pytest.raises(KeyError, match="no metric 'n'"):
        run.series("n")
    with pytest.raises(ValueError, match="x axis"):
        run.series("m", x="epochs")
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        load_runs([tmp_path / "empty"])


def test_caption_gives_each_method_its_batch_shape(tmp_path):
    runs = []
    for method, (p, g) in {"grpo": (16, 8), "spo": (128, 1)}.items():
        run = fake_run(tmp_path, method, 0, {"val/acc": [0.1, 0.2]})
        (run / "config.json").write_text(json.dumps({"method": method, "seed": 0, "steps": 1, "scale": "cpu",
                                                     "prompts_per_step": p, "group_size": g, "sft": {}}))
        runs.append(load_run(run))
    caption = plots.describe(runs)
    assert "samples/step grpo 16×8, spo 128×1" in caption and "scale cpu" in caption
    assert "16×8 samples/step" in plots.describe(runs[:1])


def test_caption_of_a_verl_run(tmp_path):
    run = fake_run(tmp_path, "gspo", 0, {"val/acc": [0.1, 0.2]})
    (run / "config.json").write_text(json.dumps({"method": "gspo", "dataset": "gsm8k", "scale": "verl-gsm8k",
                                                 "model": "Qwen/Qwen2.5-0.5B-Instruct", "gpus": 8, "nodes": 1}))
    caption = plots.describe([load_run(run)])
    assert caption.startswith("verl · Qwen/Qwen2.5-0.5B-Instruct · gsm8k · 8 GPU(s) × 1 node(s)")


def test_cli_plot_and_reproduce_errors(tmp_path, capsys):
    from rlkit.cli import main

    run = fake_run(tmp_path, "grpo", 0, {"val/acc": [0.1, 0.3]})
    assert main(["plot", str(run), "--metric", "val/acc", "--out", str(tmp_path / "acc.png")]) == 0
    assert (tmp_path / "acc.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="no run logged metric 'nope'"):
        main(["plot", str(run), "--metric", "nope", "--out", str(tmp_path / "x.png")])
    with pytest.raises(SystemExit, match=r"unknown reproductions \['nosuch'\]; valid: .*aspo"):
        main(["reproduce", "--only", "nosuch", "--results", str(tmp_path)])


# ------------------------------------------------------------------------------------------------ workers, time left


def test_workers_default_to_the_cpus_this_process_may_use(monkeypatch, capsys):
    import rlkit.lab.reproduce as reproduce
    from rlkit.cli import main

    monkeypatch.setattr(reproduce.os, "sched_getaffinity", lambda pid: {0, 2, 5})  # a taskset of 3 CPUs
    assert reproduce.default_workers() == 3
    assert reproduce._where(None, None).startswith("3 at a time, one CPU thread each, as many as the CPUs this process")
    assert reproduce._where(8, None) == "8 at a time, one CPU thread each"
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return {"notebooks": [], "minutes": {}, "reproduced": None}

    monkeypatch.setattr(reproduce, "reproduce", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["reproduce", "--only", "grpo"]) == 0
    assert seen["workers"] is None and seen["ray_address"] is None  # None: default_workers(), said when training
    assert main(["reproduce", "--only", "grpo", "--workers", "5"]) == 0 and seen["workers"] == 5
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert main(["reproduce", "--only", "grpo"]) == 0 and seen["ray_address"] == "head:6379"
    assert main(["reproduce", "--only", "grpo", "--ray-address", "other:6379", "--ray-shared"]) == 0
    assert seen["ray_address"] == "other:6379" and seen["ray_shared"] is True
    with pytest.raises(SystemExit, match="--workers is for this machine"):
        main(["reproduce", "--only", "grpo", "--workers", "2"])
    monkeypatch.delenv("RAY_ADDRESS")
    with pytest.raises(SystemExit, match="--ray-shared needs a Ray cluster"):
        main(["reproduce", "--only", "grpo", "--ray-shared"])
    assert main(["reproduce", "--only", "grpo", "--rounds", "1"]) == 0 and seen["rounds"] == 1
    assert main(["reproduce", "--only", "grpo"]) == 0 and seen["rounds"] is None
    with pytest.raises(SystemExit, match="give one of the two"):
        main(["reproduce", "--only", "grpo", "--rounds", "1", "--seeds", "3"])
    with pytest.raises(SystemExit, match="--rounds must be ≥ 0"):
        main(["reproduce", "--only", "grpo", "--rounds", "-1"])


def test_time_left_weighs_each_run_by_its_cost_and_the_slots():
    from rlkit.lab.reproduce import TimeLeft

    left = TimeLeft([40.0, 30.0, 20.0, 10.0], slots=2, now=0.0)  # longest first, two at a time
    assert left.seconds(now=0.0) == 50.0  # 40 then 10 on one slot, 30 then 20 on the other
    assert left.seconds(now=10.0) == 40.0
    left.ended(1, seconds=60.0, now=60.0)  # the 30 took 60 s: two seconds a unit of cost, not one
    assert left.text(now=60.0) == "~00:40 left"  # 40 × 2 − 60 s on the first slot, then 10 × 2 on the free one
    assert left.seconds(now=60.0) == 40.0
    left.ended(0, seconds=80.0, now=80.0)
    assert left.seconds(now=80.0) == pytest.approx(20 * 2 - 20)  # the 20, started at 60, and the 10, started now
    left.ended(2, 40.0, now=100.0)
    left.ended(3, 20.0, now=100.0)
    assert left.seconds(now=100.0) == 0.0
    assert TimeLeft([5.0], slots=4, now=0.0).text(now=9.0) == "time left: ? until a run ends"  # 5 s outlasted
    assert TimeLeft([2.0, 1.0, 1.0], slots=1, now=0.0).seconds(now=0.0) == 4.0  # by cost: 2 + 1 + 1 on the one slot


def test_a_worker_ended_by_ctrl_c_before_the_launcher_sees_it_is_an_interrupt_not_a_failed_run(tmp_path,
                                                                                               monkeypatch):
    """The race of Ctrl-C: a worker's handler ends it (exit 130) before the launcher's KeyboardInterrupt is raised,
    so the launcher first meets a broken pool. That is the interrupt, said in one line, never 'run … failed'."""
    import multiprocessing
    import os
    import signal
    import time

    from rlkit.lab.reproduce import PlannedRun, _in_processes

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "results"
    ended = _in_processes([PlannedRun("grpo", "grpo", "standard", 0)], "smoke", str(results), "cpu", 1, tick=0.1)
    deadline = time.monotonic() + 240
    with pytest.raises(KeyboardInterrupt):
        for _ in ended:
            if list(results.glob("*/seed*/metrics.jsonl")):  # the worker is training: Ctrl-C reaches it alone
                for worker in multiprocessing.active_children():
                    os.kill(worker.pid, signal.SIGINT)
            assert time.monotonic() < deadline


def test_ctrl_c_stops_the_reproduction_and_its_workers_in_one_line(tmp_path):
    """Ctrl-C as a terminal sends it, to the launcher and its workers alike, once the workers are training: one line,
    exit 130, no worker's traceback, and no worker left running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    results = tmp_path / "results"
    env = {**os.environ, "RLKIT_CACHE": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "rlkit.cli", "reproduce", "--only", "grpo", "--scale", "smoke", "--seeds", "2",
            "--workers", "2", "--results", str(results)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True,
                            preexec_fn=default_sigint)  # as from a terminal
    try:
        deadline = time.monotonic() + 240
        while not list(results.glob("*/seed*/metrics.jsonl")):  # a worker has logged a step: inside the work
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert sum("interrupted (Ctrl-C)" in line for line in err.splitlines()) == 1, err
    deadline = time.monotonic() + 10
    while True:  # the workers are gone (a zombie awaiting the container's init is no longer running)
        alive = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == proc.pid and fields[0] != "Z":  # its process group, not a zombie
                alive.append(stat.parent.name)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not alive, f"workers left running: {alive}"


@pytest.mark.parametrize(("kwargs", "seeds"), [({}, None), ({"seeds": 5}, 5), ({"scale": "smoke"}, 3)])
def test_the_pages_get_the_seeds_the_claims_were_judged_on(tmp_path, monkeypatch, kwargs, seeds):
    """Sequential (the specs' scale, no --seeds): the pages get seeds=None, every seed the rounds left, and show
    claims.json as judged; --seeds N: N; another scale (no rounds): the spec's own, as its claims were judged."""
    from rlkit.lab import paths, reproduce

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "grpo.yaml").write_text("name: grpo\nnotebook: notebooks/01_grpo.md\nmethod: grpo\nseeds: 3\n")
    (specs / "comparison.yaml").write_text("name: comparison\nnotebook: notebooks/07_comparison.md\n")
    given = []
    monkeypatch.setattr(reproduce, "train_runs", lambda planned, **kw: {})
    monkeypatch.setattr(reproduce, "seed_rounds", lambda *a, **kw: {})
    monkeypatch.setattr(reproduce.judge, "judge_all", lambda *a, **kw: [])
    monkeypatch.setattr(reproduce, "execute", lambda spec, out, params, **kw: given.append(params) or out / "nb.ipynb")
    monkeypatch.setattr(paths, "published_dir", lambda: tmp_path / "nowhere")
    reproduce.reproduce(results=tmp_path / "results", specs_dir=specs, progress=False, **kwargs)
    assert [p["seeds"] for p in given] == [seeds, seeds]  # the method's page and the comparison alike


def test_a_finished_seed_rule_names_the_claims_it_left_undecided(tmp_path, monkeypatch, capsys):
    from rlkit.lab import paths, reproduce
    from rlkit.lab.claims import BETTER, INCONCLUSIVE

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "grpo.yaml").write_text("name: grpo\nnotebook: notebooks/01_grpo.md\nmethod: grpo\nseeds: 3\n")
    at_cap = [{"id": "grpo-1", "notebook": "notebooks/01_grpo.md", "verdict": INCONCLUSIVE, "seeds": list(range(12)),
               "seeds_to_decide": 27},
              {"id": "grpo-2", "notebook": "notebooks/01_grpo.md", "verdict": BETTER, "seeds": [0, 1, 2],
               "seeds_to_decide": None}]
    below_cap = [{**at_cap[0], "seeds": list(range(9))}, at_cap[1]]  # a round still to come (a --rounds limit)
    judged = iter([at_cap, below_cap])
    monkeypatch.setattr(reproduce, "train_runs", lambda planned, **kw: {})
    monkeypatch.setattr(reproduce, "seed_rounds", lambda *a, **kw: {})
    monkeypatch.setattr(reproduce.judge, "judge_all", lambda *a, **kw: next(judged))
    monkeypatch.setattr(reproduce.judge, "save", lambda recs, results: results / "claims.json")
    monkeypatch.setattr(reproduce, "execute", lambda spec, out, params, **kw: out / "nb.ipynb")
    monkeypatch.setattr(paths, "published_dir", lambda: tmp_path / "nowhere")
    reproduce.reproduce(results=tmp_path / "results", specs_dir=specs, progress=False)
    out = capsys.readouterr().out
    assert "claims: the seed rule is finished; 1 claim stays inconclusive at the cap" in out and "grpo-1 (about 27" in out
    reproduce.reproduce(results=tmp_path / "results", specs_dir=specs, progress=False)
    assert "seed rule is finished" not in capsys.readouterr().out  # rounds left (a --rounds limit): not said


def test_an_executed_notebook_names_no_folder_of_the_machine_that_ran_it(tmp_path):
    from rlkit.lab import paths
    from rlkit.lab.reproduce import without_machine_paths

    results = tmp_path / "rc"
    nb = results / "grpo" / "01_grpo.ipynb"
    nb.parent.mkdir(parents=True)
    root = str(paths.project_root().resolve())
    nb.write_text(json.dumps({
        "cells": [{"source": [f'results = "{results}"\n'], "outputs": [{"text": f"read {root}/notebooks/x.md"}]}],
        "metadata": {"papermill": {"parameters": {"results": str(results)},
                                   "output_path": f"{results}/grpo/.01_grpo.running.ipynb"}}}))
    without_machine_paths(nb, results)
    text = nb.read_text()
    assert str(tmp_path) not in text and root not in text
    assert 'results = \\"rc\\"' in text and "read ./notebooks/x.md" in text  # outside the project: by its name


def test_no_published_notebook_names_a_machine_folder():
    published = sorted(Path(__file__).parents[1].glob("reproductions/results-*/*/*.ipynb"))
    named = [str(p) for p in published if re.search(r'"/(work|tmp|root|home|Users|mnt)/', p.read_text())]
    assert published and not named, named
