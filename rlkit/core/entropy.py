"""Token entropy from logits, streamed over the vocabulary.

H(p) = logsumexp(z) − Σ_v softmax(z)_v·z_v. For a 150k-token vocabulary the softmax of a long response
does not fit beside the logits, so the sum runs over vocabulary chunks with an online (running-max)
softmax: peak extra memory is one ``(..., chunk)`` slice. Each chunk is computed in float32, so bf16 logits
are safe. Differentiable (the entropy bonus needs its gradient).
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor, *, chunk_size: int | None = 8192) -> torch.Tensor:
    """Entropy ``(...)`` of softmax(logits ``(..., V)``); ``chunk_size`` vocabulary entries at a time (None: all)."""
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits need a non-empty vocabulary dimension, got shape {tuple(logits.shape)}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1 or None, got {chunk_size}")
    if chunk_size is None or chunk_size >= logits.shape[-1]:
        z = logits.float()
        return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)
    run_max = run_sum = run_dot = None  # m, Σ e^{z−m}, Σ e^{z−m}·z
    for chunk in logits.split(chunk_size, dim=-1):
        z = chunk.float()
        chunk_max = z.amax(dim=-1)
        new_max = chunk_max if run_max is None else torch.maximum(run_max, chunk_max)
        e = torch.exp(z - new_max.unsqueeze(-1))
        if run_max is None:
            run_sum, run_dot = e.sum(-1), (e * z).sum(-1)
        else:
            rescale = torch.exp(run_max - new_max)
            run_sum = run_sum * rescale + e.sum(-1)
            run_dot = run_dot * rescale + (e * z).sum(-1)
        run_max = new_max
    return run_max + torch.log(run_sum) - run_dot / run_sum
