"""One module per method; importing this package registers every estimator and loss in :mod:`rlkit.registry`."""

from rlkit.methods import aepo, aspo, grpo, gspo, hapo, spo

__all__ = ["aepo", "aspo", "grpo", "gspo", "hapo", "spo"]
