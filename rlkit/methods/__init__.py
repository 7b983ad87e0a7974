"""One module per method: its ``Config``, its functions, and their registration in :mod:`rlkit.registry` (the method,
its estimator and its loss), which importing this package does. A method module imports only :mod:`rlkit.core` and
:mod:`rlkit.registry`; adding a method is one module here, its import below, and its tests. A method's
policy loss is its paper's math; :mod:`rlkit.methods.fast`, imported after them, registers the fused path of the
ones that have one (``registry.register_fast_policy_loss``)."""

from rlkit.methods import aepo, aspo, grpo, gspo, hapo, spo
from rlkit.methods import fast  # noqa: F401  (after the methods: it speeds up their registered losses)

__all__ = ["aepo", "aspo", "grpo", "gspo", "hapo", "spo"]
