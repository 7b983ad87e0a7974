"""The reproduction's runs on a Ray cluster (``rlkit reproduce --ray-address``): a cluster of two nodes simulated on
this machine (``ray.cluster_utils.Cluster``: two raylets of one CPU each, the head with Ray's dashboard, whose state
API keeps the task records), smoke-scale runs sent to it as one-CPU tasks. Ray's records must show runs on both
nodes, and every run's files must equal those of the same runs trained locally, bit for bit (timings aside).
About 1.5–2 minutes on 2 cores: the cluster's start-up (~25 s), a Ray worker's imports, three runs each way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.lab.reproduce import PlannedRun, train_runs
from rlkit.metrics import read_metrics

ray = pytest.importorskip("ray")  # verl brings it

pytestmark = pytest.mark.timeout(600)

PLAN = [PlannedRun("grpo", "grpo", "standard", 0), PlannedRun("gspo-stress", "gspo", "stress", 1),
        PlannedRun("grpo", "grpo", "standard", 1)]
TIMING = ("timing_s/", "perf/")
"""Keys that measure time (the steps' wall time and the throughput it gives): the only ones allowed to differ."""


def untimed(run_dir: Path) -> list[str]:
    """Each step's metrics without the timings, as JSON (every bit of each float; NaN equal to NaN)."""
    return [json.dumps({"step": r["step"], **{k: v for k, v in r["data"].items() if not k.startswith(TIMING)}})
            for r in read_metrics(run_dir / "metrics.jsonl", whole=True)]


@pytest.fixture
def cluster(monkeypatch):
    from ray.cluster_utils import Cluster

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
    from ray.util.state import list_tasks

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert set(train_runs(PLAN, scale="smoke", results=local, workers=2, progress=False)) == {
        "grpo seed 0", "gspo-stress seed 1", "grpo seed 1"}
    minutes = train_runs(PLAN, scale="smoke", results=remote, ray_address=cluster.address, progress=False)
    assert set(minutes) == {"grpo seed 0", "gspo-stress seed 1", "grpo seed 1"}

    ray.init(address=cluster.address)
    try:  # the job is over; its tasks are still in the cluster's records, each with the node that ran it
        tasks = [t for t in list_tasks(detail=True, limit=1000) if t.name.startswith("rlkit run ")]
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
