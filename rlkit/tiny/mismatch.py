"""A sampler that is not the trainer: the train–inference mismatch of vLLM or SGLang, made on a CPU.

The tiny engine's sampler and trainer are one float32 model (agreeing to ~1e-6); :class:`MismatchedSampler` makes
them disagree as a real stack does: ``rollout_dtype`` rounds its weights to ``bfloat16`` or ``int8`` (each linear
weight per output row, 127 levels; compute stays float32), ``rollout_top_p`` samples the nucleus (Holtzman et al.
2020) with the truncated log-probs, as vLLM, on the untempered logits (the tiny runs sample at T = 1, where the two
agree). :func:`rlkit.tiny.step.rl_step` then recomputes the old log-probs with the trainer and logs the mismatch.
A stale sampler (``staleness`` k, as an asynchronous trainer's) is the policy of k steps earlier
(:func:`behaviour_policy`); :func:`policy_eval` measures the current policy beside it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor, nn

from rlkit.core.ops import masked_mean
from rlkit.hooks import side_generator
from rlkit.tiny.task import rollout, score_rollout

DTYPES = ("float32", "bfloat16", "int8")
"""The sampler's weights (``rollout_dtype``)."""

MASKED = -1e30
"""The logit of a token outside the nucleus: probability 0, finite (``-inf`` would make the entropy a NaN)."""


def rounded(model: nn.Module, dtype: str) -> dict[str, Tensor]:
    """``model``'s weights as an engine holding them in ``dtype`` has them, back in float32 (:data:`DTYPES`)."""
    if dtype not in DTYPES:
        raise ValueError(f"rollout_dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if dtype == "bfloat16":
        return {k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}
    if dtype == "int8":
        linear = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        return {k: quantized_int8(v) if k in linear else v for k, v in state.items()}
    return state


def quantized_int8(weight: Tensor) -> Tensor:
    """Symmetric per-output-row int8 quantization of a ``(out, in)`` matrix, dequantized (largest magnitude: 127)."""
    scale = weight.abs().amax(dim=-1, keepdim=True) / 127.0
    return (weight / scale.clamp(min=torch.finfo(weight.dtype).tiny)).round().clamp(-127, 127) * scale


def nucleus(logits: Tensor, top_p: float) -> Tensor:
    """``logits`` (…, V), every token outside the top-``top_p`` nucleus (never the most probable) :data:`MASKED`."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"rollout_top_p must be in (0, 1], got {top_p}")
    if top_p == 1.0:
        return logits
    probs, order = logits.float().softmax(-1).sort(dim=-1, descending=True)
    before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each one
    drop_sorted = before >= top_p  # the nucleus already reached without it
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, MASKED)


class MismatchedSampler(nn.Module):
    """The policy as another engine samples it: :func:`rounded` weights, the nucleus; called as the model is."""

    def __init__(self, model: nn.Module, dtype: str = "float32", top_p: float = 1.0) -> None:
        super().__init__()
        rounded(model, dtype)  # the settings checked before any work
        nucleus(torch.zeros(1), top_p)
        self.inner, self.dtype, self.top_p = model, dtype, top_p

    @property
    def config(self):
        return self.inner.config

    @property
    def embed(self) -> nn.Module:
        return self.inner.embed

    def new_cache(self, *args, **kwargs):
        return self.inner.new_cache(*args, **kwargs)

    def follow(self, source: nn.Module) -> MismatchedSampler:
        """Take ``source``'s current weights as this engine holds them (each step, before sampling)."""
        self.inner.load_state_dict(rounded(source, self.dtype))
        return self

    def forward(self, *args, **kwargs) -> Tensor:
        return nucleus(self.inner(*args, **kwargs), self.top_p)


def mismatched(dtype: str, top_p: float) -> bool:
    """Whether these settings make the sampler differ from the trainer."""
    return dtype != "float32" or top_p < 1.0


def old_logp_source(dtype: str, top_p: float, correction: str | None, chosen: str | None) -> str:
    """Where a run's old log-probs come from (None: ``trainer`` if mismatched or corrected, else ``sampler``)."""
    return chosen or ("trainer" if mismatched(dtype, top_p) or correction else "sampler")


def measures_mismatch(dtype: str, top_p: float, correction: str | None, chosen: str | None) -> bool:
    """Whether a run computes the trainer's log-probs beside the sampler's, and so logs the mismatch."""
    return mismatched(dtype, top_p) or old_logp_source(dtype, top_p, correction, chosen) == "trainer"


# ------------------------------------------------------------------------------------------------ a stale sampler


def behaviour_policy(run: Any, state: Any) -> nn.Module:
    """The model that samples this step: the policy itself, or with ``staleness`` k the policy as it was k steps
    earlier (the SFT start while fewer than k steps have passed)."""
    if run.behaviour is None:
        return run.model
    state.policies.append({k: v.detach().clone() for k, v in run.model.state_dict().items()})
    del state.policies[: -(run.cfg.staleness + 1)]
    run.behaviour.load_state_dict(state.policies[0])
    return run.behaviour


def policy_eval(run: Any, problems: list, temperature_fn: Any, step: int) -> dict[str, float]:
    """With a stale sampler (``staleness`` > 0): one rollout of the current policy (before this step's update) on
    ``problems`` at the training's temperatures, with its own generator: ``policy/entropy`` and
    ``policy/score/mean``, defined as ``actor/entropy`` and ``critic/score/mean`` are."""
    t0 = time.perf_counter()
    device = next(run.model.parameters()).device
    with torch.no_grad():
        ro = rollout(run.model, run.tokenizer, problems, max_new_tokens=run.max_new, form=run.form,
                     temperature=run.cfg.temperature, temperature_fn=temperature_fn,
                     generator=side_generator(run.cfg.seed, step, "policy-eval", device))
        scored = score_rollout(ro, problems)
        out = {"policy/entropy": masked_mean(ro.entropy, ro.mask).item(),
               "policy/score/mean": scored.rewards.mean().item()}
    out["timing_s/policy_eval"] = time.perf_counter() - t0
    return out
