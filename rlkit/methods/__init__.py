"""One module per method: its ``Config``, its functions, and their registration in :mod:`rlkit.registry` (the method,
its estimator and its loss), which importing this package does. A method module imports only :mod:`rlkit.core` and
:mod:`rlkit.registry`; adding a method is one module here, its import below, and its tests."""

from rlkit.methods import aepo, aspo, grpo, gspo, hapo, spo

__all__ = ["aepo", "aspo", "grpo", "gspo", "hapo", "spo"]
