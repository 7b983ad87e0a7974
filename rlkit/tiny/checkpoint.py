"""What a tiny-engine run keeps between steps and on disk: :class:`RunState`, the atomic ``checkpoint.pt``
(:func:`save_checkpoint`, :func:`restore_checkpoint`) and ``env.json`` (:func:`environment`)."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import rlkit
from rlkit.errors import CannotResume, DamagedFile
from rlkit.files import atomic_write, read_torch
from rlkit.tiny import machine as this_machine
from rlkit.tiny.config import RLConfig

Tensor = torch.Tensor


@dataclass
class RunState:
    """Everything a resumed run needs besides the model and optimizer."""

    step: int = 0
    prompt_gen: torch.Generator = field(default_factory=torch.Generator)
    sample_gen: torch.Generator | None = None
    method_state: dict[str, Any] | None = None  # The method's hooks' state (:meth:`rlkit.hooks.Hooks.state_dict`).
    memory: dict[Any, dict[str, Tensor]] = field(default_factory=dict)  # Kept responses, per prompt id.
    policies: list[dict[str, Tensor]] = field(default_factory=list)
    """``staleness`` > 0: the policy's weights at the start of each of the last ``staleness`` + 1 steps, oldest
    (the rollouts' sampler) first."""


def save_checkpoint(path: Path, model, opt, state: RunState, *, logged: dict[str, Any] | None = None,
                    config: dict[str, Any] | None = None) -> None:
    """Write model, optimizer and ``state`` to ``path`` (``checkpoint.pt``), atomically, with the step's ``logged``
    lines (``{"metrics": ..., "eval": ...}``: a resume re-logs a torn one) and the run's ``config``."""
    blob = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": state.step,
            "prompt_gen": state.prompt_gen.get_state(), "sample_gen": state.sample_gen.get_state(),
            "method_state": state.method_state, "memory": state.memory, "policies": state.policies,
            "logged": logged, "config": config}
    with atomic_write(path, "wb", fsync=False) as f:  # a kill leaves the previous checkpoint or this one
        torch.save(blob, f)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The contents of :func:`save_checkpoint`'s ``path``; :class:`~rlkit.errors.CannotResume` if it is damaged."""
    try:
        return read_torch(path, ("model", "optimizer", "step"), weights_only=False)
    except DamagedFile as e:
        raise CannotResume(f"{e}: the run cannot resume; start it again in another --out") from None


def restore_checkpoint(path: Path | dict, model, opt, state: RunState) -> None:
    """Load :func:`save_checkpoint`'s ``path`` (or contents) into ``model``, ``opt`` and ``state``."""
    blob = path if isinstance(path, dict) else load_checkpoint(path)
    model.load_state_dict(blob["model"])
    opt.load_state_dict(blob["optimizer"])
    state.step = blob["step"]
    state.prompt_gen.set_state(blob["prompt_gen"])
    state.sample_gen.set_state(blob["sample_gen"])
    if "memory" not in blob:
        raise CannotResume("the checkpoint was written by an older rlkit (no method state): start the run again")
    state.method_state, state.memory = blob["method_state"], blob["memory"]
    state.policies = blob.get("policies", [])


def environment(cfg: RLConfig, device: str, sft: dict | None = None) -> dict[str, Any]:
    """``env.json``: versions, seed, hardware, kernels, fingerprint (:mod:`rlkit.tiny.machine`), SFT start."""
    here = Path(rlkit.__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=here).stdout.strip() or None
        # the library differs from the commit (uncommitted edits under rlkit/): the commit alone does not reproduce it
        dirty = commit is not None and subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=here,
                                                      timeout=5).returncode == 1
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    machine = this_machine.describe()
    return {"rlkit": rlkit.__version__, "commit": commit, "dirty": dirty, "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform(), "processor": machine["cpu_model"],
            "cpu_flags": machine["cpu_flags"], "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "kernels": machine["kernels"], "fingerprint": machine["fingerprint"], "device": device,
            "cuda": torch.cuda.get_device_name(0) if device.startswith("cuda") else None, "seed": cfg.seed,
            "sft_start": None if sft is None else {"source": sft.get("source"), "sha256": sft.get("sha256"),
                                                   "val_acc": sft.get("val/acc")}}
