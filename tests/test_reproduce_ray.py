"""The reproduction's runs on a Ray cluster (``rlkit reproduce --ray-address``): a cluster of two nodes simulated on
this machine (``ray.cluster_utils.Cluster``: two raylets of one CPU each, the head with Ray's dashboard, whose state
API serves the task records), smoke-scale runs sent to it as one-CPU tasks.

- Ray's records show runs on both nodes, one CPU each; every run's files equal those of the same runs trained
  locally, bit for bit (timings aside); a run killed part-way in the results folder is resumed on its node, and
  finished ones are reused;
- a run whose node is killed mid-run is retried on another and ends equal to a local run: on shared storage it
  resumes from its checkpoint, without it it starts again;
- the environment the Ray workers are given: the kernel pins and switches a local worker would have.

About 45-80 s each on 2 cores (more when the cores are shared): the cluster's start-up (~15-25 s), a Ray worker's
imports, the runs each way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit import environ
from rlkit.lab.reproduce import PlannedRun, train_runs
from rlkit.metrics import read_metrics
from rlkit.tiny.config import build_config
from rlkit.tiny.rl import train

ray = pytest.importorskip("ray")  # verl brings it

pytestmark = pytest.mark.timeout(600)

PLAN = [PlannedRun("grpo", "grpo", "standard", 0), PlannedRun("gspo-stress", "gspo", "stress", 1),
        PlannedRun("grpo", "grpo", "standard", 1)]
TIMING = ("timing_s/", "perf/")
"""Keys that measure time (the steps' wall time and the throughput it gives): the only ones allowed to differ."""


def untimed(run: Path | list[str]) -> list[str]:
    """Each step's metrics without the timings, as JSON (every bit of each float; NaN equal to NaN): of a run folder's
    ``metrics.jsonl``, or of its lines."""
    lines = run if isinstance(run, list) else (run / "metrics.jsonl").read_text().splitlines()
    return [json.dumps({"step": r["step"], **{k: v for k, v in r["data"].items() if not k.startswith(TIMING)}})
            for r in map(json.loads, lines)]


def task_records(count: int, timeout: float = 60) -> list:
    """The records of the runs' task attempts (``rlkit run ...``) once ``count`` of them have ended: workers report
    to the records every second or so, after the launcher has its results."""
    import time

    from ray.util.state import list_tasks

    deadline = time.monotonic() + timeout
    while True:
        tasks = [t for t in list_tasks(detail=True, limit=1000) if t.name.startswith("rlkit run ")]
        if sum(t.state in ("FINISHED", "FAILED") for t in tasks) >= count or time.monotonic() > deadline:
            return tasks
        time.sleep(0.5)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))  # before the nodes start: their workers inherit it
    monkeypatch.setenv("RAY_enable_worker_prestart", "0")  # the raylets read it: no idle workers on two cores
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})  # the dashboard: list_tasks' server
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def test_runs_on_two_ray_nodes_equal_local_ones_bit_for_bit(tmp_path, monkeypatch, cluster):
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert set(train_runs(PLAN, scale="smoke", results=local, workers=2, progress=False)) == {
        "grpo seed 0", "gspo-stress seed 1", "grpo seed 1"}
    killed = remote / "grpo" / "seed1"  # a run an earlier reproduction left after step 1: resumed, as locally
    train(build_config("grpo", "smoke", {"seed": 1}), killed, progress=False, stop_after=1)
    before = (killed / "metrics.jsonl").read_text().splitlines()
    minutes = train_runs(PLAN, scale="smoke", results=remote, ray_address=cluster.address, progress=False)
    assert set(minutes) == {"grpo seed 0", "gspo-stress seed 1", "grpo seed 1"}
    assert (killed / "metrics.jsonl").read_text().splitlines()[:2] == before  # steps 0, 1 kept, timings and all

    ray.init(address=cluster.address)
    try:  # the job is over; its tasks are still in the cluster's records, each with the node that ran it
        tasks = task_records(len(PLAN))
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()
    assert sorted(t.name for t in tasks) == sorted(f"rlkit run {p.name} seed {p.seed}" for p in PLAN)
    assert {t.state for t in tasks} == {"FINISHED"}
    assert {t.node_id for t in tasks} == nodes and len(nodes) == 2, [(t.name, t.node_id) for t in tasks]
    assert {t.required_resources.get("CPU") for t in tasks} == {1.0}

    for p in PLAN:
        here, there = local / p.name / f"seed{p.seed}", remote / p.name / f"seed{p.seed}"
        assert untimed(there) == untimed(here), f"{p.name} seed {p.seed}: the Ray run's metrics differ"
        assert len(untimed(there)) == 3  # steps 0..2 of the smoke scale
        for name in ("eval.jsonl", "config.json"):
            assert (there / name).read_bytes() == (here / name).read_bytes(), f"{p.name} seed {p.seed}: {name}"
        env = [{k: json.loads((d / "env.json").read_text())[k] for k in ("kernels", "torch_threads", "fingerprint")}
               for d in (here, there)]
        assert env[0] == env[1] and env[1]["torch_threads"] == 1, env  # the pins and one thread reached Ray's workers
    assert train_runs(PLAN, scale="smoke", results=remote, ray_address=cluster.address, progress=False) == {}


@pytest.mark.parametrize("shared", [True, False], ids=["shared-results", "files-sent-back"])
def test_a_run_lost_with_its_node_is_retried_and_ends_as_an_uninterrupted_one(tmp_path, cluster, shared,
                                                                              monkeypatch):
    """The node training the run is killed after its second step; Ray runs the task again on a node added then, and
    the run ends equal to an uninterrupted local one. On shared results (``ray_shared``) the retry resumes from the
    checkpoint the lost attempt left there; without, that checkpoint was in the lost node's scratch folder, and the
    retry trains the run from the start."""
    import shutil
    import tempfile
    import threading
    import time

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    run = PlannedRun("grpo", "grpo", "standard", 0, (("steps", 8),))
    local, results = tmp_path / "local", tmp_path / "results"
    train_runs([run], scale="smoke", results=local, workers=1, progress=False)
    scratch = set(Path(tempfile.gettempdir()).glob("rlkit-run-*"))  # the nodes' scratch folders: this machine's

    def metrics_on_the_node() -> Path | None:
        if shared:
            return results / "grpo" / "seed0" / "metrics.jsonl"
        new = set(Path(tempfile.gettempdir()).glob("rlkit-run-*")) - scratch
        return next(iter(new), Path("-")) / "grpo" / "seed0" / "metrics.jsonl"

    ray.init(address=cluster.address)  # train_runs uses this connection
    try:
        head = ray.get_runtime_context().get_node_id()

        def sleep(seconds, started):
            Path(started).touch()
            time.sleep(seconds)

        holding = tmp_path / "holding"
        hold = ray.remote(num_cpus=1)(sleep).options(  # the head's CPU taken: the run goes to the other node
            scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote(600, str(holding))
        deadline = time.monotonic() + 120
        while not holding.exists():  # running, not just submitted: else the run may take the head's CPU first
            assert time.monotonic() < deadline, "the task holding the head's CPU never started"
            time.sleep(0.1)
        out: dict = {}
        # every attempt stops before step 3 (steps 0-2 logged, step 2's checkpoint saved) until the test lets it on:
        # the node is killed at that point, not raced to it (environ.HOLD reaches the Ray workers: cluster.worker_env)
        held = tmp_path / "held"
        monkeypatch.setenv(environ.HOLD, f"3:{held}")

        def wait_held() -> int:
            deadline = time.monotonic() + 240
            while not held.exists():
                assert thread.is_alive() and time.monotonic() < deadline, f"no attempt held before step 3: {out}"
                time.sleep(0.1)
            time.sleep(0.2)  # the pid written
            return int(held.read_text())

        thread = threading.Thread(target=lambda: out.update(minutes=train_runs(
            [run], scale="smoke", results=results, ray_address=cluster.address, ray_shared=shared, progress=False)))
        thread.start()
        first = wait_held()
        metrics = metrics_on_the_node()
        assert [r["step"] for r in read_metrics(metrics)] == [0, 1, 2]
        before = metrics.read_text().splitlines()[:2]  # steps 0 and 1, checkpointed
        lost = cluster.worker_nodes.copy().pop()
        cluster.remove_node(lost, allow_graceful=False)
        gone_with_the_node(first)  # before the hold is lifted: a holder still alive would go on and finish the run
        held.unlink()
        cluster.add_node(num_cpus=1)
        assert wait_held() != first  # the retry, in another process, at the same point
        held.unlink()
        thread.join(timeout=300)
        assert not thread.is_alive() and out["minutes"].keys() == {"grpo seed 0"}
        attempts = sorted((t.attempt_number, t.state, t.node_id) for t in task_records(2))
        ray.cancel(hold, force=True)
    finally:
        ray.shutdown()
        if not shared:  # the lost attempt's scratch folder, which its node would have taken with it
            for folder in set(Path(tempfile.gettempdir()).glob("rlkit-run-*")) - scratch:
                shutil.rmtree(folder, ignore_errors=True)
    assert [(a, s) for a, s, _ in attempts] == [(0, "FAILED"), (1, "FINISHED")], attempts
    assert attempts[0][2] == lost.node_id and attempts[1][2] not in (lost.node_id, head), attempts
    after = (results / "grpo" / "seed0" / "metrics.jsonl").read_text().splitlines()
    if shared:  # resumed: the lines of the steps before the checkpoint kept as they were, timings and all
        assert after[:2] == before, "the retry trained the run again instead of resuming it"
    else:  # trained again from the start: the same numbers, other timings
        assert after[:2] != before and untimed(after[:2]) == untimed(before)
    there, here = results / "grpo" / "seed0", local / "grpo" / "seed0"
    assert untimed(there) == untimed(here) and len(untimed(there)) == 9
    assert (there / "eval.jsonl").read_bytes() == (here / "eval.jsonl").read_bytes()
    assert not list(results.glob(".rlkit-ray-*")), "the launcher's token for shared storage was left behind"


def gone_with_the_node(pid: int) -> None:
    """A lost node takes its processes with it; a simulated node's worker notices its raylet's end only later and
    could meanwhile go on: it is killed here, as the machine going down would, and its end awaited (a zombie is
    dead: its parent, the lost raylet, is gone too)."""
    import os
    import signal
    import time

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        status = Path(f"/proc/{pid}/status")
        try:
            if "\tZ" in next(line for line in status.read_text().splitlines() if line.startswith("State:")):
                return
        except (OSError, StopIteration):
            return
        assert time.monotonic() < deadline, f"process {pid} outlived its node"
        time.sleep(0.05)


def test_the_workers_get_the_kernel_pins_and_switches_a_local_worker_would(monkeypatch):
    """A local worker inherits this process's environment and pins what is unset when it imports rlkit; a Ray worker
    on another machine inherits nothing of it: ``runtime_env`` hands it the same values."""
    from rlkit.lab.cluster import worker_env

    for key in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "RLKIT_NUMERICS", "RLKIT_RETRAIN_SFT"):
        monkeypatch.delenv(key, raising=False)
    assert worker_env() == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}  # pinned, the default
    monkeypatch.setenv("RLKIT_NUMERICS", "compatible")
    monkeypatch.setenv("RLKIT_RETRAIN_SFT", "1")
    assert worker_env() == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "RLKIT_NUMERICS": "compatible",
                            "RLKIT_RETRAIN_SFT": "1"}
    monkeypatch.setenv("MKL_CBWR", "AUTO")  # the user's own setting wins, as numerics.pin lets it
    assert worker_env()["MKL_CBWR"] == "AUTO"
    monkeypatch.setenv("RLKIT_NUMERICS", "native")
    monkeypatch.delenv("MKL_CBWR")
    assert worker_env() == {"RLKIT_NUMERICS": "native", "RLKIT_RETRAIN_SFT": "1"}
