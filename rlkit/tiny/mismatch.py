"""A sampler that is not the trainer: the train–inference mismatch, made on a CPU.

At scale the engine that samples (vLLM, SGLang) holds the policy's weights in bf16 or int8, runs its own kernels and
may truncate the distribution (top-p), so the probability it gives a sampled token differs from the trainer's for the
same weights; the samples are off-policy for the trainer (rollout correction: :mod:`rlkit.core.rollout_correction`).
The tiny engine's sampler and trainer are one float32 model and agree to ~1e-6: this module makes them disagree the
way a real stack does, and nothing else changes.

- ``rollout_dtype`` — the weights the sampler holds: ``float32`` (the trainer's), ``bfloat16`` (every weight rounded
  to bf16, as a bf16 engine stores the model: 8 bits of mantissa), ``int8`` (each linear layer's weight matrix
  quantized per output row, symmetric, 127 levels: the weights of a W8 engine; embeddings and norms kept, as such
  engines keep them). Compute stays float32: the weights alone are another engine's, activations are not rounded.
- ``rollout_top_p`` — nucleus sampling (Holtzman et al. 2020): the sampler draws from the smallest set of tokens
  whose probability reaches p, renormalised, and logs the log-probs of that truncated distribution, as vLLM does;
  the trainer's distribution keeps every token. The nucleus is taken on the untempered logits (vLLM applies
  temperature first; the tiny runs sample at T = 1, where the two agree).

:class:`MismatchedSampler` is what the sampler calls in place of the model; :func:`rlkit.tiny.rl.rl_step` then
recomputes the old log-probs with the trainer (verl's ``old_log_prob``), logs the mismatch
(:func:`rlkit.core.rollout_correction.mismatch_metrics`) and applies ``rollout_correction`` where one is set.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

DTYPES = ("float32", "bfloat16", "int8")
"""The sampler's weights (``rollout_dtype``)."""

MASKED = -1e30
"""The logit of a token outside the nucleus: probability exactly 0 after softmax, finite under any temperature the
engine takes (``-inf`` would make the entropy's 0·(−inf) a NaN)."""


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
    """Symmetric per-output-row int8 quantization of a ``(out, in)`` matrix, dequantized: each row's largest
    magnitude maps to 127 and every weight to the nearest of the 255 levels (a row of zeros stays zeros)."""
    scale = weight.abs().amax(dim=-1, keepdim=True) / 127.0
    return (weight / scale.clamp(min=torch.finfo(weight.dtype).tiny)).round().clamp(-127, 127) * scale


def nucleus(logits: Tensor, top_p: float) -> Tensor:
    """``logits`` (…, V) with every token outside the top-``top_p`` nucleus set to :data:`MASKED`: the most
    probable tokens whose cumulative probability first reaches ``top_p`` are kept (the most probable always)."""
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
    """The policy as another inference engine samples it: a model of its own with :func:`rounded` weights, its
    logits cut to the nucleus. The sampler (:func:`rlkit.tiny.sampler.sample`) calls it as it calls the model."""

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
    """Where a run's old log-probs come from (``old_logp_source``; None: ``trainer`` when the sampler is
    mismatched or a correction is set, else ``sampler``)."""
    return chosen or ("trainer" if mismatched(dtype, top_p) or correction else "sampler")


def measures_mismatch(dtype: str, top_p: float, correction: str | None, chosen: str | None) -> bool:
    """Whether a run computes the trainer's log-probs beside the sampler's, and so logs the mismatch."""
    return mismatched(dtype, top_p) or old_logp_source(dtype, top_p, correction, chosen) == "trainer"
