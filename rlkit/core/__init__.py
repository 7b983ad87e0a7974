"""Tensor math shared by all methods: masked ops, group statistics, loss aggregation, PPO clip, entropy, rollout
correction (the sampler-trainer mismatch: its metrics and the TIS / masked-IS / IcePop weights)."""

from rlkit.core.ops import (
    AGG_MODES,
    agg_loss, behaviour_weights, check_shapes, clip_metrics, clipped_surrogate, group_advantage, group_index,
    group_mean_std, group_sum, log_ratio, masked_count, masked_mean, masked_share, masked_sum, reduce_policy_loss,
)
from rlkit.core.entropy import entropy_from_logits
from rlkit.core.rollout_correction import correct, icepop, mismatch_metrics, seq_mis, seq_tis, token_tis

__all__ = [
    "AGG_MODES", "agg_loss", "entropy_from_logits", "group_advantage", "group_index", "group_mean_std", "group_sum",
    "masked_count", "masked_mean", "masked_share", "masked_sum",
    "behaviour_weights", "clip_metrics", "clipped_surrogate", "log_ratio", "reduce_policy_loss", "check_shapes",
    "correct", "icepop", "mismatch_metrics", "seq_mis", "seq_tis", "token_tis",
]
