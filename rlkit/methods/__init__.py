"""One module per method: its ``Config``, its functions, its hooks (:mod:`rlkit.hooks`) and their registration in
:mod:`rlkit.registry`, which importing this package does. A method module imports only :mod:`rlkit.core`,
:mod:`rlkit.hooks` and :mod:`rlkit.registry`; adding a method is one module here (the registry imports every module
of this folder: :func:`rlkit.registry.import_method_modules`; the imports below are the methods that came first) and
its tests (README: "Adding a method"). A method's policy loss is its paper's math; :mod:`rlkit.methods.fast`, imported after
them, registers the fused path of the ones that have one (``registry.register_fast_policy_loss``)."""

from rlkit.methods import aepo, aspo, cispo, dapo, dr_grpo, grpo, gspo, hapo, spo
from rlkit.methods import fast  # noqa: F401  (after the methods: it speeds up their registered losses)

__all__ = ["aepo", "aspo", "cispo", "dapo", "dr_grpo", "grpo", "gspo", "hapo", "spo"]
