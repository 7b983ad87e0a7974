"""Shared random batches for the math tests."""

from __future__ import annotations

import importlib.util
import os
import uuid
from pathlib import Path

import numpy as np
import pytest

import rlkit  # noqa: F401  (before torch: the pinned float kernels every rlkit process runs, rlkit/numerics.py)
import torch
from hypothesis import settings

torch.set_num_threads(1)  # CI has 2 cores; small tensors run fastest single-threaded

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """The script ``benchmarks/<name>.py`` as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# CI explores the same examples every run (a red CI is then reproducible); local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def default_sigint() -> None:
    """``preexec_fn`` of the Ctrl-C tests' children: SIGINT's default action, as a terminal's shell runs a command
    (a suite started from a background shell inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def make_batch(seed: int, *, B: int | None = None, T: int | None = None, noise: float = 0.3, empty_rows: bool = False):
    """A random RL batch: left-aligned response masks of random lengths, log-probs, old log-probs, advantages."""
    g = torch.Generator().manual_seed(seed)
    B = B or int(torch.randint(2, 12, (1,), generator=g))
    T = T or int(torch.randint(1, 9, (1,), generator=g))
    lengths = torch.randint(0 if empty_rows else 1, T + 1, (B,), generator=g)
    if not empty_rows:
        lengths[0] = T
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    logp = -3.0 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old_logp = logp + noise * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    return {"logp": logp, "old_logp": old_logp, "adv": adv, "mask": mask.double(), "lengths": lengths, "gen": g}


def make_groups(seed: int, B: int, *, kind: str = "int") -> tuple[object, torch.Tensor]:
    """Random group ids (ints, strings, or a numpy object array of strings as verl passes) and binary rewards."""
    g = torch.Generator().manual_seed(10_000 + seed)
    n_groups = int(torch.randint(1, max(2, B // 2) + 1, (1,), generator=g))
    raw = torch.randint(0, n_groups, (B,), generator=g)
    rewards = torch.randint(0, 2, (B,), generator=g).double()
    if kind == "int":
        return raw, rewards
    ids = np.array([f"uid-{int(i)}" for i in raw], dtype=object)
    return (ids if kind == "numpy" else list(ids)), rewards


def make_inputs(seed: int = 0):
    """:func:`make_batch`'s batch, every advantage input of its responses (groups, correctness, code positions
    and success, baselines) and token entropies: ``(batch, AdvantageInputs, entropy)``."""
    from rlkit.registry import AdvantageInputs

    b = make_batch(seed, noise=0.4)
    B = len(b["mask"])
    ids, rewards = make_groups(seed, B)
    g = torch.Generator().manual_seed(seed)
    lengths = b["mask"].sum(-1)
    called = torch.rand(B, generator=g) < 0.6
    first_code_pos = torch.where(called, torch.floor(torch.rand(B, generator=g) * lengths), -1.0)
    inputs = AdvantageInputs(rewards, ids, b["mask"], correct=rewards > 0, lengths=lengths,
                             first_code_pos=first_code_pos, code_pass=torch.rand(B, generator=g) < 0.7,
                             baselines=torch.rand(B, generator=g, dtype=torch.float64))
    entropy = torch.rand(b["mask"].shape, generator=g, dtype=torch.float64) * 2
    return b, inputs, entropy


@pytest.fixture
def seeds():
    return range(24)


OWNER = "RLKIT_TEST_OWNER"
"""Environment variable that marks every process a test using :func:`reaper` starts, and their descendants."""


@pytest.fixture
def reaper(monkeypatch):
    """Ends every process the test starts, whatever its outcome. Each inherits ``RLKIT_TEST_OWNER=<a token of this
    test>`` from the test's environment, as do the processes they start in sessions of their own (a launch's
    ``main_ppo``, Ray's and vLLM's processes): after the test they are all continued and stopped (SIGTERM, SIGCONT,
    then SIGKILL; :func:`rlkit.verl.launch.runner.stop_tree`), frozen ones (SIGSTOP) included. Yields the token."""
    from rlkit.verl.launch import runner

    token = uuid.uuid4().hex
    monkeypatch.setenv(OWNER, token)
    yield token
    for _ in range(2):  # the second round waits for the killed ones to be gone, and ends any started meanwhile
        runner.stop_tree(None, token, variable=OWNER, grace_s=5.0)
    left = runner.marked_pids(token, OWNER)
    assert not left, f"processes the test started survived SIGKILL: {left}"
