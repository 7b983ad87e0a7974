"""Tool-use statistics of a batch of responses: where the first code/tool call sits, how many calls, how many
passed — logged by every method on the tool task, named ``tool/*``. ASPO (arXiv 2508.19201, §4.5) defined them;
its own mechanism's metrics stay under its name."""

from __future__ import annotations

import math
from typing import Any

import torch

Tensor = torch.Tensor


def per_sample(x: Any, name: str, batch: int, device: torch.device) -> Tensor:
    t = torch.as_tensor(x, device=device)
    if t.dim() != 1 or t.shape[0] != batch:
        raise ValueError(f"{name} must have one value per sample, shape ({batch},); got {tuple(t.shape)}")
    return t


def flags(x: Any, name: str, batch: int, device: torch.device) -> Tensor:
    t = per_sample(x, name, batch, device)
    if t.dtype == torch.bool:
        return t
    if not ((t == 0) | (t == 1)).all():
        raise ValueError(f"{name} must be boolean or 0/1 per sample (for ±1 rewards pass rewards > 0)")
    return t != 0


def tool_metrics(
    first_code_pos: Any, correct: Any, code_calls: Any, code_pass: Any = None
) -> dict[str, float]:
    """Tool-use metrics of a batch, named ``tool/*``, logged by every method on the tool task (all inputs
    ``(B,)``; positions NaN or negative = no code).

    ``tool/first_code_pos/mean`` (over responses with code), ``tool/code_ratio`` (share with code),
    ``tool/code_rounds/mean`` (calls per response, all responses), ``tool/correct_code_ratio`` (share both
    correct and with code) and, given ``code_pass``, ``tool/code_pass_ratio`` (over responses with code).
    A mean over no responses is NaN.
    """
    p = torch.as_tensor(first_code_pos).detach().to(torch.float64)
    if p.dim() != 1:
        raise ValueError(f"first_code_pos must be (B,), got shape {tuple(p.shape)}")
    batch, device = p.shape[0], p.device
    used = torch.isfinite(p) & (p >= 0)
    calls = per_sample(code_calls, "code_calls", batch, device).to(torch.float64)
    right = flags(correct, "correct", batch, device)
    n_used = int(used.sum())
    metrics = {
        "tool/first_code_pos/mean": p[used].mean().item() if n_used else math.nan,
        "tool/code_ratio": used.double().mean().item(),
        "tool/code_rounds/mean": calls.mean().item(),
        "tool/correct_code_ratio": (used & right).double().mean().item(),
    }
    if code_pass is not None:
        passed = flags(code_pass, "code_pass", batch, device)
        metrics["tool/code_pass_ratio"] = (passed & used).sum().item() / n_used if n_used else math.nan
    return metrics
